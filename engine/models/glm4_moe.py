"""GLM-4.5 / 4.6 / 4.7 (Glm4MoeForCausalLM): GQA with qk-norm and partial NeoX rotary, MoE MLPs.

Attention: explicit `head_dim` (128 on the real models, not hidden/heads),
biases on q/k/v but not o, optional per-head RMSNorm of q and k before the
rotary (`use_qk_norm`: GLM-4.5 and 4.6 use it, 4.5-Air does not), and NeoX
(half-split) rotation of only the first `partial_rotary_factor` of each head.
Note GLM-4 dense rotates interleaved pairs instead; the MoE models do not.

Feed-forward: dense below `first_k_dense_replace`, then sigmoid-routed MoE
with a shared expert (engine.models.moe_mlp). The multi-token-prediction
layer the checkpoints carry (`num_nextn_predict_layers`) is skipped by the
loader, or loaded as the speculative draft with --speculative mtp
(engine/models/mtp.py).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.collectives import parallel
from engine.layers.linear import RowParallelLinear, RowSlice
from engine.layers.moe import ROUTER_FP32_SUFFIXES
from engine.layers.moe_routing import RoutingConfig
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, model_rotary
from engine.model_files.model_config import ModelConfig
from engine.models.base import CausalLM
from engine.models.decoder import (
    ForwardContext,
    PreNormDecoderLayer,
    RotatedKVAttention,
    gqa_qkv_proj,
)
from engine.models.moe_mlp import feed_forward, moe_packed_modules

# transformers' Glm4MoeConfig default when a config does not say.
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.5


class Glm4MoeAttention(RotatedKVAttention, nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.layer = layer
        self.head_dim = cfg.head_dim
        self.qkv_proj, self.num_heads, self.num_kv_heads = gqa_qkv_proj(
            cfg, bool(cfg.get("attention_bias", False))
        )
        self.o_proj = RowParallelLinear(
            RowSlice.heads(cfg.num_heads, self.head_dim, "attention heads"),
            cfg.hidden_size,
            bias=False,
        )
        if cfg.get("use_qk_norm", False):
            eps = cfg.get("rms_norm_eps", 1e-5)
            self.q_norm = RMSNorm(self.head_dim, eps)
            self.k_norm = RMSNorm(self.head_dim, eps)
        else:
            self.q_norm = self.k_norm = None
        self.rotary = rotary
        self.scale = self.head_dim**-0.5

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x).view(-1, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = self.fused_attention(positions, q, k, v, ctx)  # None: the steps below
        if out is None:
            if self.q_norm is not None:
                self.rotary(positions, q, ctx.step_cache)
                self.rotary(positions, k, ctx.step_cache)
            else:
                # q and k heads are adjacent: rotate them in one call.
                self.rotary(positions, qkv[:, : self.num_heads + self.num_kv_heads], ctx.step_cache)
            if self.kv_rotation is not None:  # after RoPE (see RotatedKVAttention)
                q, k, v = (self.kv_rotation.rotate(t) for t in (q, k, v))
            out = ctx.backend.forward(self.layer, q, k, v, ctx.pool, ctx.meta, self.scale)
        if self.kv_rotation is not None:  # the values were rotated: undo it (H H = I)
            out = self.kv_rotation.rotate(out)
        return parallel.all_reduce(self.o_proj(out.flatten(1)))


def glm4_moe_decoder_layer(
    cfg: ModelConfig, layer: int, rotary: RotaryEmbedding, routing: RoutingConfig | None
) -> PreNormDecoderLayer:
    return PreNormDecoderLayer(
        Glm4MoeAttention(cfg, layer, rotary),
        feed_forward(cfg, layer, routing),
        cfg.hidden_size,
        cfg.get("rms_norm_eps", 1e-5),
    )


class Glm4MoeForCausalLM(CausalLM):
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        **moe_packed_modules(),
    }
    fp32_parameter_suffixes = ROUTER_FP32_SUFFIXES

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        routing = RoutingConfig.from_config(cfg.raw) if cfg.get("n_routed_experts") else None
        rotary = model_rotary(cfg, interleaved=False, default_partial=DEFAULT_PARTIAL_ROTARY_FACTOR)
        self.build(cfg, lambda i: glm4_moe_decoder_layer(cfg, i, rotary, routing))
