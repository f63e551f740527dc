"""Tiny DeepSeek V3.2 and GLM-5.x checkpoints (DeepSeek sparse attention), built with
transformers' own classes and saved as transformers saves them.

The sizes are the DeepSeek V3 fixture's (engine.devtools.testing.checkpoints),
three layers deep, with a small `index_topk` so that prompts of a few dozen
tokens are sparse: each query past the eighth position attends to eight.
Eight indexer heads: a position scores exactly zero when every head's ReLU
cuts it (about 2**-heads of them), and ties at the top-k boundary are
broken by torch.topk's order, which two computations need not share.
"""

from __future__ import annotations

from pathlib import Path

from engine.devtools.testing.checkpoints import DEEPSEEK_V3, _randomize, save_model

INDEX_TOPK = 8

_DSA_COMMON = {
    **DEEPSEEK_V3,
    "num_hidden_layers": 3,
    "index_topk": INDEX_TOPK,
    "index_n_heads": 8,
    "index_head_dim": 16,
}
DEEPSEEK_V32 = dict(_DSA_COMMON)
# GLM-5's shape: default rope, and a "shared" layer reusing layer 0's selection.
GLM_MOE_DSA = {
    **_DSA_COMMON,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "routed_scaling_factor": 2.5,
    "indexer_types": ["full", "shared", "full"],
}


def build_deepseek_v32(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    return _build(
        DeepseekV32Config, DeepseekV32ForCausalLM, DEEPSEEK_V32, directory, seed, overrides
    )


def build_glm_moe_dsa(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    return _build(GlmMoeDsaConfig, GlmMoeDsaForCausalLM, GLM_MOE_DSA, directory, seed, overrides)


def _build(config_class, model_class, base: dict, directory: Path, seed: int, overrides) -> Path:
    import torch

    torch.manual_seed(seed)
    model = model_class(config_class(**{**base, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory)
