"""The decoder pieces every model builds from: the forward context, GQA attention with
its run-time K/V rotation, the pre-norm layer, the SwiGLU MLP and the trunk.

Tensor parallel: each rank holds its query heads and their key/value heads
(replicated when there are fewer KV heads than ranks) and a slice of the
MLP's intermediate dimension; o_proj and down_proj give partial sums that
the attention and MLP blocks all-reduce (docs/DISTRIBUTED.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from engine.attention.metadata import AttentionMetadata
from engine.collectives import parallel
from engine.kv.rotation import HadamardRotation
from engine.layers.layer_ops import TORCH_LAYER_OPS
from engine.layers.linear import FusedLinear, RowParallelLinear, RowSlice
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.layers.vocab_parallel import VocabParallelEmbedding
from engine.model_files.model_config import ModelConfig


@dataclass
class ForwardContext:
    """Passed down the layers for one step: where the cache is and how to read it."""

    pool: object
    meta: AttentionMetadata
    backend: object
    # Values every layer would otherwise recompute (rotary rows for this step's positions).
    step_cache: dict = field(default_factory=dict)
    # Hybrid models: the recurrent-state slots of this step's sequences
    # (engine/kv/state_pool.py StepStates); None for models without recurrent state.
    states: object | None = None


class RotatedKVAttention:
    """Hadamard rotation of K and V (DESIGN.md §3) for GQA attention, at run time.

    After the rotary embedding q, k and v are rotated together (qH, kH, vH;
    one product over all heads), so the cache stores rotated keys and
    values and every attention backend sees them unchanged: q·k is
    unchanged, and the attention output comes out rotated (oH), which one
    more product undoes before o_proj (H is symmetric and orthonormal, so
    its own inverse). The weights are left as loaded, so quantized or packed
    weights keep their form.
    """

    kv_rotation: HadamardRotation | None = None
    head_dim: int
    # What `fused_attention` hands the backend; the attention classes set them.
    layer: int
    rotary: RotaryEmbedding
    scale: float

    def enable_kv_rotation(self, batch_invariant: bool = False) -> str:
        if self.kv_rotation is None:
            self.kv_rotation = HadamardRotation(self.head_dim, batch_invariant)
        return f"K and V heads: {self.kv_rotation.describe()}, at run time"

    def fused_attention(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: ForwardContext,
    ) -> torch.Tensor | None:
        """Rotary, rotation, KV write and attention with the first three as the backend's
        one kernel (the Triton backend's `rope_rotate_write`) on q, k, v before rotary;
        the attention output (still rotated: the caller undoes it), or None where the
        backend has no such kernel or it does not apply (nothing is done then)."""
        fused = getattr(ctx.backend, "rope_rotate_write", None)
        if fused is None:
            return None
        rotated_q = fused(
            self.layer, q, k, v, positions, self.rotary, self.kv_rotation, ctx.pool, ctx.meta
        )
        if rotated_q is None:
            return None
        return ctx.backend.attend(self.layer, rotated_q, ctx.pool, ctx.meta, self.scale)


class PreNormDecoderLayer(nn.Module):
    """The common decoder layer: x + attn(norm(x)), then x + mlp(norm(x)).

    The first residual add and the norm after it are one layer op (the C kernel
    does both in one pass; engine/layers/layer_ops.py)."""

    ops = TORCH_LAYER_OPS

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float):
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        attended = self.self_attn(positions, self.input_layernorm(x), ctx)
        norm = self.post_attention_layernorm
        x, normed = self.ops.add_rms_norm(attended, x, norm.weight, norm.eps)
        return x + self.mlp(normed)


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
        split = [self.num_heads, self.num_kv_heads, self.num_kv_heads]
        out = self.fused_attention(positions, *qkv.split(split, dim=1), ctx)
        if out is None:
            # q and k heads are adjacent: rotate them in one call.
            self.rotary(positions, qkv[:, : self.num_heads + self.num_kv_heads], ctx.step_cache)
            if self.kv_rotation is not None:  # after RoPE: q, k and v in one product
                qkv = self.kv_rotation.rotate(qkv)
            q, k, v = qkv.split(split, dim=1)
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
