"""The feed-forward block of DeepSeek-style MoE decoders (DeepSeek V3, Kimi K2.x, GLM-4.5+).

Layers below `first_k_dense_replace` (and, for DeepSeek, layers off the
`moe_layer_freq` beat; for Kimi Linear, those `mlp_layer_types` calls
"dense") keep a dense SwiGLU MLP of `intermediate_size`; the others route
each token to `num_experts_per_tok` of `n_routed_experts` small experts
(`moe_intermediate_size`) and add `n_shared_experts` always-on ones, stored
as one MLP of n_shared * moe_intermediate_size.
"""

from __future__ import annotations

from contextlib import nullcontext

from torch import nn

from engine.collectives import parallel
from engine.layers.moe import SparseMoE
from engine.layers.moe_routing import RoutingConfig
from engine.model_files.model_config import ModelConfig
from engine.models.decoder import GatedMLP


def is_moe_layer(cfg: ModelConfig, layer: int) -> bool:
    if not cfg.get("n_routed_experts"):
        return False
    # transformers' newer MoE configs (DeepSeek V3.2, GLM-5) spell the plan out per layer,
    # derived from first_k_dense_replace when left out; where written, it decides.
    layer_types = cfg.get("mlp_layer_types")
    if layer_types:
        return layer_types[layer] == "sparse"
    first_moe = cfg.get("first_k_dense_replace") or 0
    every = cfg.get("moe_layer_freq") or 1
    return layer >= first_moe and layer % every == 0


def feed_forward(cfg: ModelConfig, layer: int, routing: RoutingConfig | None) -> nn.Module:
    """The MLP for `layer`: a SparseMoE on MoE layers, else a dense GatedMLP."""
    hidden = cfg.hidden_size
    if routing is None or not is_moe_layer(cfg, layer):
        return GatedMLP(hidden, cfg["intermediate_size"])
    expert_size = cfg["moe_intermediate_size"]
    # Expert parallel: a rank's experts are whole; else each is split like a dense MLP.
    whole = parallel.layout().expert_parallel

    def make_expert(_: int) -> GatedMLP:
        with parallel.unsplit() if whole else nullcontext():
            return GatedMLP(hidden, expert_size, reduce=False)

    num_shared = cfg.get("n_shared_experts") or 0
    shared = GatedMLP(hidden, expert_size * num_shared, reduce=False) if num_shared else None
    return SparseMoE(hidden, routing, make_expert, shared)


def moe_packed_modules() -> dict[str, tuple[str, str]]:
    """Checkpoint gate_proj/up_proj (dense, shared and routed experts) -> fused gate_up_proj."""
    return {"gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}
