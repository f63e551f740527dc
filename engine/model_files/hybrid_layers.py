"""The layer plan of hybrid models (Kimi Linear): which layers keep KV, which a recurrent state.

Read from the config alone (no torch), so the planner sizes a hybrid model the
way the engine's model declares it: paged KV for the full-attention (MLA)
layers only, plus a fixed recurrent state per sequence for the
linear-attention (KDA) layers (engine/kv/recurrent_state.py).
"""

from __future__ import annotations

from engine.errors import UnsupportedModelError
from engine.kv.recurrent_state import RecurrentStateLayout
from engine.model_files.model_config import ModelConfig

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


def is_hybrid(cfg: ModelConfig) -> bool:
    return LINEAR_ATTENTION in (cfg.get("layer_types") or [])


def layer_plan(cfg: ModelConfig) -> list[str]:
    """Each layer's attention kind, checked."""
    plan = list(cfg["layer_types"])
    if len(plan) != cfg.num_layers or not set(plan) <= {LINEAR_ATTENTION, FULL_ATTENTION}:
        raise UnsupportedModelError(
            f"config.json layer_types {plan!r}: expected {cfg.num_layers} entries of "
            f"{LINEAR_ATTENTION!r} or {FULL_ATTENTION!r}"
        )
    return plan


def kv_layer_count(cfg: ModelConfig) -> int:
    """Layers that keep KV: the full-attention ones of a hybrid, else all."""
    return layer_plan(cfg).count(FULL_ATTENTION) if is_hybrid(cfg) else cfg.num_layers


def recurrent_state_layout(cfg: ModelConfig) -> RecurrentStateLayout | None:
    """One sequence's state, for a hybrid: per KDA layer the short-convolution state of
    q, k and v, and a linear_head_dim x linear_head_dim matrix per head (KDA's keys and
    values are equally wide). None for a model without linear-attention layers."""
    if not is_hybrid(cfg):
        return None
    heads, dim = cfg["linear_num_heads"], cfg["linear_head_dim"]
    return RecurrentStateLayout(
        num_layers=layer_plan(cfg).count(LINEAR_ATTENTION),
        num_heads=heads,
        key_dim=dim,
        value_dim=dim,
        conv_channels=3 * heads * dim,
        conv_width=cfg["linear_conv_kernel_dim"],
    )
