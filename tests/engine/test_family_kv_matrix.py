"""Every served family in every KV mode, with weights packed and not, against transformers.

The matrix: families (Llama, Qwen2, GLM-4, GLM-4.5 MoE, Kimi K2's MLA MoE) x
KV cache (BF16, FP8 e4m3) x rotation (none, Hadamard) x weights (ordinary
float32, or on the GGUF grids a Q4_1 file holds, which the CPU packs and
multiplies with int8 activations). Each case serves BF16 weights, as a user
would, and must give transformers' float32 logits within the bounds the MoE
tests state (tests/engine/moe_checkpoints.py: mean |diff| and the per-position
max that 90% of positions stay within, top-1 agreement), for a prefill and
for the same tokens fed as decode steps over the cached prefix (the fused
and kernel decode paths). Int8 activations add their rounding to BF16's; the
bounds are the FP8 ones for those cases (measured worst case below).

A case that cannot load or run fails here: Kimi on a grid with a BF16 KV cache
used to, when grid packing dropped the kv_b_proj matrix MLA attention reads.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.devtools.testing.checkpoints import make_checkpoint
from engine.devtools.testing.realistic_checkpoints import put_on_grid
from engine.layers.cpu_grid_weights import grid_weight_of
from tests.engine.checkpoints import reference_logits
from tests.engine.moe_checkpoints import assert_within_quantized_bounds

FAMILIES = ("llama", "qwen2", "glm4", "glm4_moe", "kimi_k2")
KV_MODES = [("bf16", "none"), ("bf16", "hadamard"), ("fp8_e4m3", "none"), ("fp8_e4m3", "hadamard")]
WEIGHTS = ("float32", "grid")
# From 3: some tiny tokenizers' low ids are specials. 64 positions: on a tiny random MoE
# model an expert that rounding chooses apart moves a position's logits by ~1, and the p90
# bound needs enough positions that the few such stay in the last decile.
PROMPT = torch.randint(3, 256, (64,), generator=torch.Generator().manual_seed(7)).tolist()
DECODED = 8  # the last prompt tokens fed one per decode step
# Kimi's kv_b_proj reads the latent: 32 wide, so a grid can cover it (16 could not pack).
OVERRIDES = {"kimi_k2": {"kv_lora_rank": 32}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(family, weights) -> (folder, transformers' float32 logits on PROMPT)."""
    root = tmp_path_factory.mktemp("matrix")
    made = {}
    for family in FAMILIES:
        for weights in WEIGHTS:
            folder = root / f"{family}-{weights}"
            tiny = make_checkpoint(family, folder, **OVERRIDES.get(family, {}))
            if weights == "grid":  # the same rounding of the same tensors in both forms
                for folder in {tiny.path, tiny.reference}:
                    put_on_grid(folder)
            made[family, weights] = (tiny.path, reference_logits(tiny.reference, PROMPT))
    return made


def _packed_layers(llm: LLM) -> dict[str, bool]:
    return {
        name: grid_weight_of(module) is not None
        for name, module in llm.engine.model.named_modules()
        if hasattr(module, "method")
    }


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("kv, rotation", KV_MODES, ids=lambda v: v)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_serves_in_every_kv_mode(family, kv, rotation, weights, checkpoints):
    folder, expected = checkpoints[family, weights]
    llm = LLM(str(folder), dtype="bfloat16", kv_cache_dtype=kv, kv_rotation=rotation)
    assert llm.engine.kv_rotation == rotation
    packed = _packed_layers(llm)
    if weights == "grid":
        assert sum(packed.values()) >= len(packed) // 2, packed
    else:
        assert not any(packed.values())
    if family == "kimi_k2":  # attention reads kv_b_proj's matrix; the rest packs
        attn = "model.layers.0.self_attn."
        assert not packed[attn + "kv_b_proj"]
        assert packed[attn + "fused_qkv_a_proj"] == (weights == "grid")
    loose = kv == "fp8_e4m3" or weights == "grid"
    prefilled = llm.prompt_logits(PROMPT)
    assert_within_quantized_bounds(prefilled, expected, fp8=loose)
    decoded = llm.prompt_logits(PROMPT, decode_last=DECODED)
    assert_within_quantized_bounds(decoded, expected, fp8=loose)
