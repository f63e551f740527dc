"""Llama-family decoder (Llama, Qwen2, SmolLM2): GQA, NeoX rotary, SwiGLU, RMSNorm.

Tensor parallel: each rank holds its query heads and their key/value heads
(replicated when there are fewer KV heads than ranks) and a slice of the
MLP's intermediate dimension; o_proj and down_proj give partial sums that
the attention and MLP blocks all-reduce (docs/DISTRIBUTED.md).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.distributed import parallel
from engine.layers.layer_ops import TORCH_LAYER_OPS
from engine.layers.linear import FusedLinear, RowParallelLinear, RowSlice
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, model_rotary
from engine.layers.vocab_parallel import VocabParallelEmbedding
from engine.model_files.model_config import ModelConfig
from engine.models.base import CausalLM, ForwardContext, PreNormDecoderLayer, RotatedKVAttention


class GQAAttention(RotatedKVAttention, nn.Module):
    """Fused qkv projection, rotary, (Hadamard rotation,) paged attention, output projection."""

    def __init__(
        self, cfg: ModelConfig, layer: int, qkv_bias: bool, o_bias: bool, rotary: RotaryEmbedding
    ):
        super().__init__()
        self.layer = layer
        self.head_dim = cfg.head_dim
        self.qkv_proj, self.num_heads, self.num_kv_heads = gqa_qkv_proj(cfg, qkv_bias)
        self.o_proj = RowParallelLinear(
            RowSlice.heads(cfg.num_heads, self.head_dim, "attention heads"),
            cfg.hidden_size,
            bias=o_bias,
        )
        self.rotary = rotary
        self.scale = self.head_dim**-0.5

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        heads = self.num_heads + 2 * self.num_kv_heads
        qkv = qkv.view(-1, heads, self.head_dim)
        # q and k heads are adjacent: rotate them in one call.
        self.rotary(positions, qkv[:, : self.num_heads + self.num_kv_heads], ctx.step_cache)
        if self.kv_rotation is not None:  # after RoPE: q, k and v in one product
            qkv = self.kv_rotation.rotate(qkv)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        out = ctx.backend.forward(self.layer, q, k, v, ctx.pool, ctx.meta, self.scale)
        if self.kv_rotation is not None:  # the values were rotated: undo it (H H = I)
            out = self.kv_rotation.rotate(out)
        return parallel.all_reduce(self.o_proj(out.flatten(1)))


def gqa_qkv_proj(cfg: ModelConfig, bias: bool) -> tuple[FusedLinear, int, int]:
    """The fused q/k/v projection for this rank's heads: (layer, q heads, kv heads)."""
    head_dim = cfg.head_dim
    q = RowSlice.heads(cfg.num_heads, head_dim, "attention heads")
    kv = RowSlice.heads(cfg.num_kv_heads, head_dim, "key/value heads", replicas=True)
    layer = FusedLinear(cfg.hidden_size, {"q": q, "k": kv, "v": kv}, bias=bias)
    return layer, q.size // head_dim, kv.size // head_dim


class GatedMLP(nn.Module):
    """SwiGLU over this rank's slice of the intermediate dimension. `reduce`: sum the
    partial outputs over the ranks here (a dense MLP); MoE experts leave it to the block.
    SwiGLU is a layer op (engine/layers/layer_ops.py: torch, or C once chosen)."""

    ops = TORCH_LAYER_OPS

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, reduce: bool = True):
        super().__init__()
        piece = RowSlice.even(intermediate, "MLP intermediate size")
        self.gate_up_proj = FusedLinear(hidden, {"gate": piece, "up": piece}, bias)
        self.down_proj = RowParallelLinear(piece, hidden, bias=bias)
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.ops.silu_mul(self.gate_up_proj(x)))
        return parallel.all_reduce(out) if self.reduce else out


def llama_decoder_layer(
    cfg: ModelConfig, layer: int, qkv_bias: bool, o_bias: bool, rotary: RotaryEmbedding
) -> PreNormDecoderLayer:
    return PreNormDecoderLayer(
        GQAAttention(cfg, layer, qkv_bias, o_bias, rotary),
        GatedMLP(cfg.hidden_size, cfg["intermediate_size"], cfg.get("mlp_bias", False)),
        cfg.hidden_size,
        cfg.get("rms_norm_eps", 1e-6),
    )


class LlamaModel(nn.Module):
    """The trunk: embed, the decoder layers, the final norm.

    `decode_step`, when the engine sets one at load (on CPU, FusedDecode:
    engine/models/cpu_decode_step.py), may run all the layers of a step in one
    call; it declines the steps it does not cover, which run the layers here.
    """

    decode_step = None

    def __init__(self, cfg: ModelConfig, layer_factory):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layer_factory(i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.get("rms_norm_eps", 1e-6))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext):
        x = self.embed_tokens(input_ids)
        if self.decode_step is None or not self.decode_step.run(x, positions, ctx):
            for layer in self.layers:
                x = layer(positions, x, ctx)
        return self.norm(x)


class LlamaForCausalLM(CausalLM):
    supports_deterministic = True
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }
    qkv_bias_default = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        qkv_bias = cfg.get("attention_bias", self.qkv_bias_default)
        o_bias = self.o_bias(cfg)
        rotary = model_rotary(cfg, interleaved=False)
        self.build(cfg, lambda i: llama_decoder_layer(cfg, i, qkv_bias, o_bias, rotary))

    @staticmethod
    def o_bias(cfg: ModelConfig) -> bool:
        return bool(cfg.get("attention_bias", False))


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: biases on q/k/v, none on o_proj."""

    qkv_bias_default = True

    @staticmethod
    def o_bias(cfg: ModelConfig) -> bool:
        return False
