"""Kimi Linear (KimiLinearForCausalLM, model_type kimi_linear): KDA layers beside MLA layers, and MoE.

The config's layer plan (`layer_types`, or `linear_attn_config`'s 1-based
`kda_layers` / `full_attn_layers` in released checkpoints; read by
engine/model_files/config_aliases.py) says which layers are Kimi Delta
Attention (engine/models/kimi_linear_attention.py: a recurrent state per
sequence, no KV) and which are MLA. The MLA layers are DeepSeek V3's
(engine/models/deepseek_v3.py) without rotary position (NoPE: the "rope" part
of the key is stored and dotted as it comes) and with the plain softmax scale;
only they keep paged KV, so the KV layout counts them alone, and their pool
rows are numbered 0..n_mla-1. `mlp_layer_types` says which layers are dense
and which MoE (sigmoid routing with a correction bias, shared experts).

Checkpoint names are the released ones: `block_sparse_moe.experts.N.w1/w2/w3`
(gate, down, up) and per-projection conv kernels `q_conv1d`/`k_conv1d`/`v_conv1d`.

Under tensor parallelism the KDA heads split as attention heads do
(engine/models/kimi_linear_attention.py), so each rank's state pool holds its
heads' states; the MLA layers split as DeepSeek V3's, over a replicated latent.
"""

from __future__ import annotations

import re
from dataclasses import replace

from torch import nn

from engine.collectives import parallel
from engine.kv.mla_pool import MLALayout
from engine.kv.recurrent_state import RecurrentStateLayout
from engine.layers.moe import ROUTER_FP32_SUFFIXES
from engine.layers.moe_routing import RoutingConfig
from engine.model_files.hybrid_layers import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    layer_plan,
    recurrent_state_layout,
)
from engine.model_files.model_config import ModelConfig
from engine.models.base import CausalLM
from engine.models.decoder import PreNormDecoderLayer
from engine.models.deepseek_v3 import MLAAttention, mla_dims
from engine.models.kimi_linear_attention import KimiDeltaAttention
from engine.models.moe_mlp import feed_forward, moe_packed_modules

# transformers' KimiLinearAttention builds its kv_a/q_a norms with the RMSNorm default
# eps, not the config's rms_norm_eps.
MLA_LATENT_NORM_EPS = 1e-6
# Released checkpoint names -> the engine's (applied before the fused-module mapping).
_RENAMES = (
    (re.compile(r"\.block_sparse_moe\."), ".mlp."),
    (re.compile(r"(\.experts\.\d+)\.w1\."), r"\1.gate_proj."),
    (re.compile(r"(\.experts\.\d+)\.w3\."), r"\1.up_proj."),
    (re.compile(r"(\.experts\.\d+)\.w2\."), r"\1.down_proj."),
)


class NoRotary(nn.Module):
    """MLA without position encoding: the rope part of q and k stays as projected."""

    def forward(self, positions, x, step_cache=None) -> None:
        return None


def kimi_mla_attention(cfg: ModelConfig, pool_layer: int) -> MLAAttention:
    attn = MLAAttention(cfg, pool_layer, NoRotary())
    dims = attn.dims
    attn.scale = (dims.nope_dim + dims.rope_dim) ** -0.5  # no YaRN mscale: no rotary at all
    for norm in (attn.kv_a_layernorm, getattr(attn, "q_a_layernorm", None)):
        if norm is not None:
            norm.eps = MLA_LATENT_NORM_EPS
    return attn


class KimiLinearForCausalLM(CausalLM):
    fp32_parameter_suffixes = (*ROUTER_FP32_SUFFIXES, "self_attn.dt_bias")

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.packed_modules = dict(moe_packed_modules())
        if cfg.get("q_lora_rank"):
            self.packed_modules["q_a_proj"] = ("fused_qkv_a_proj", "q_a")
            self.packed_modules["kv_a_proj_with_mqa"] = ("fused_qkv_a_proj", "kv_a")
        self.plan = plan = layer_plan(cfg)
        routing = RoutingConfig.from_config(cfg.raw) if cfg.get("n_routed_experts") else None
        # Each kind numbers its own layers: MLA rows in the KV pool, KDA slots in the state pool.
        index_within_kind = [plan[:i].count(kind) for i, kind in enumerate(plan)]

        def decoder_layer(i: int) -> PreNormDecoderLayer:
            if plan[i] == LINEAR_ATTENTION:
                attn = KimiDeltaAttention(cfg, index_within_kind[i])
            else:
                attn = kimi_mla_attention(cfg, index_within_kind[i])
            eps = cfg.get("rms_norm_eps", 1e-6)
            return PreNormDecoderLayer(attn, feed_forward(cfg, i, routing), cfg.hidden_size, eps)

        self.build(cfg, decoder_layer)

    def kv_layout(self) -> MLALayout:
        """MLA latent rows for the full-attention layers only; KDA layers keep no KV."""
        dims = mla_dims(self.config)
        return MLALayout(
            num_layers=self.plan.count(FULL_ATTENTION),
            kind="mla",
            latent_dim=dims.lora_rank + dims.rope_dim,
            rope_dim=dims.rope_dim,
        )

    def recurrent_state_layout(self) -> RecurrentStateLayout:
        """One sequence's state on this rank: its share of the KDA heads (all at TP 1)."""
        whole = recurrent_state_layout(self.config)  # never None: the plan has KDA layers
        heads = parallel.split_size(whole.num_heads, "linear_num_heads")
        return replace(whole, num_heads=heads, conv_channels=3 * heads * whole.key_dim)

    def checkpoint_target(self, name: str) -> tuple[str, str | None]:
        return super().checkpoint_target(engine_name(name))

    def skip_checkpoint_tensor(self, name: str) -> bool:
        return super().skip_checkpoint_tensor(engine_name(name))


def engine_name(name: str) -> str:
    for pattern, replacement in _RENAMES:
        name = pattern.sub(replacement, name)
    return name
