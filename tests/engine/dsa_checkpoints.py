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

import tempfile
from pathlib import Path

from engine.devtools.testing.checkpoints import DEEPSEEK_V3, _randomize, save_model
from engine.devtools.testing.layouts import copy_checkpoint, read_tensors
from engine.devtools.testing.quantized import as_fp8_block, is_linear_weight

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


# What the FP8 releases (DeepSeek-V3.2, GLM-5-FP8) keep of the indexer: wq_b and wk in FP8
# blocks like the attention's projections, weights_proj in BF16, k_norm as it is.
_INDEXER_FP8 = (".indexer.wq_b.weight", ".indexer.wk.weight")
_INDEXER_BF16 = ".indexer.weights_proj.weight"


def is_released_fp8_weight(name: str) -> bool:
    if name.endswith(_INDEXER_BF16):
        return False
    return is_linear_weight(name) or name.endswith(_INDEXER_FP8)


def as_released_fp8(build, directory: Path, block=(128, 128)) -> tuple[Path, Path]:
    """A tiny DSA model (`build(folder)`) written as the FP8 releases store it:
    (the FP8 folder, a sibling reference folder of the same weights dequantized)."""
    import torch

    reference = directory.with_name(directory.name + ".reference")
    with tempfile.TemporaryDirectory() as scratch:
        base = build(Path(scratch) / "base")
        tensors = read_tensors(base)
        for name, tensor in tensors.items():
            if name.endswith(_INDEXER_BF16):
                tensors[name] = tensor.to(torch.bfloat16)
        rounded = copy_checkpoint(base, Path(scratch) / "bf16_head_weights", tensors)
        return as_fp8_block(rounded, directory, reference, block, is_released_fp8_weight)


def _build(config_class, model_class, base: dict, directory: Path, seed: int, overrides) -> Path:
    import torch

    torch.manual_seed(seed)
    model = model_class(config_class(**{**base, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory)
