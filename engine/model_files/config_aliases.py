"""Config keys some families spell their own way, read into the names the engine uses.

Kimi Linear (`kimi_linear`) writes MoE and context fields under its own names
(transformers maps them with `attribute_map`), and released checkpoints nest
the linear-attention shape and the layer plan in `linear_attn_config`, with
1-based layer numbers. Both spellings become the engine's: the DeepSeek-style
MoE keys, `max_position_embeddings`, `linear_head_dim` / `linear_num_heads` /
`linear_conv_kernel_dim`, and 0-based per-layer `layer_types` and
`mlp_layer_types`, with transformers' KimiLinearConfig defaults where a key is
absent. Keys already in the engine's spelling win.
"""

from __future__ import annotations

from typing import Any

KIMI_LINEAR_KEYS = {
    "model_max_length": "max_position_embeddings",
    "moe_renormalize": "norm_topk_prob",
    "num_expert_group": "n_group",
    "num_experts": "n_routed_experts",
    "num_local_experts": "n_routed_experts",
    "num_experts_per_token": "num_experts_per_tok",
    "num_shared_experts": "n_shared_experts",
    "moe_router_activation_func": "scoring_func",
}
# KimiLinearConfig's defaults for the linear-attention shape, and its linear_attn_config names.
KIMI_LINEAR_SHAPE = {
    "linear_head_dim": ("head_dim", 128),
    "linear_num_heads": ("num_heads", 32),
    "linear_conv_kernel_dim": ("short_conv_kernel_size", 4),
}


def normalise_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` with the engine's spellings added where its model type has its own."""
    if raw.get("model_type") != "kimi_linear":
        return raw
    raw = dict(raw)
    for theirs, ours in KIMI_LINEAR_KEYS.items():
        if theirs in raw and raw.get(ours) is None:
            raw[ours] = raw[theirs]
    nested = raw.get("linear_attn_config") or {}
    for ours, (theirs, default) in KIMI_LINEAR_SHAPE.items():
        if raw.get(ours) is None:
            raw[ours] = nested.get(theirs, default)
    layers = int(raw["num_hidden_layers"])
    if not raw.get("layer_types"):
        raw["layer_types"] = _kimi_linear_layer_plan(nested, layers)
    if not raw.get("mlp_layer_types"):
        first_dense = raw.get("first_k_dense_replace")
        first_dense = 1 if first_dense is None else int(first_dense)
        raw["mlp_layer_types"] = ["dense" if i < first_dense else "sparse" for i in range(layers)]
    return raw


def _kimi_linear_layer_plan(nested: dict[str, Any], layers: int) -> list[str | None]:
    """The released 1-based lists when present, else KimiLinearConfig's default beat
    (every fourth layer full attention, from the fifth)."""
    if "full_attn_layers" in nested and "kda_layers" in nested:
        plan: list[str | None] = [None] * layers
        for number in nested["full_attn_layers"]:
            plan[number - 1] = "full_attention"
        for number in nested["kda_layers"]:
            plan[number - 1] = "linear_attention"
        return plan
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(layers)]
