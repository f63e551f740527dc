"""Hadamard rotation of K and V (DESIGN.md §3): the matrices, and that it changes nothing
but rounding, for GQA (Llama, Qwen2, GLM-4, GLM-4.5 MoE) and MLA (DeepseekV3 / Kimi)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.devtools.testing.checkpoints import make_checkpoint
from engine.kv.rotation import HadamardRotation, hadamard_block_size, hadamard_matrix

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 201, 4, 76, 200, 9, 14, 15, 92, 6]
FAMILIES = ("llama", "qwen2", "glm4", "glm4_moe", "kimi_k2")
# float32 weights and KV: the rotation is exact up to float32 summation order.
FLOAT32_TOL = 2e-5


@pytest.mark.parametrize("n", [1, 2, 8, 64, 128])
def test_sylvester_matrix_is_orthonormal_and_symmetric(n):
    h = hadamard_matrix(n)
    assert torch.allclose(h @ h.T, torch.eye(n), atol=1e-6)
    assert torch.equal(h, h.T)
    assert torch.allclose(h.abs(), torch.full((n, n), n**-0.5))


def test_other_dims_get_block_diagonal_hadamard():
    assert [hadamard_block_size(d) for d in (64, 96, 80, 576, 512, 7)] == [64, 32, 16, 64, 512, 1]
    rotation = HadamardRotation(96)
    h = rotation.matrix()
    assert torch.allclose(h @ h.T, torch.eye(96), atol=1e-6)
    assert torch.equal(h[:32, 32:], torch.zeros(32, 64))  # no mixing across blocks
    assert "3 blocks of 32" in rotation.describe()
    with pytest.raises(ValueError):
        hadamard_matrix(96)


@pytest.mark.parametrize("dim", [64, 96])
def test_rotate_is_x_times_h_and_its_own_inverse(dim):
    torch.manual_seed(0)
    rotation = HadamardRotation(dim)
    x = torch.randn(5, 3, dim)
    assert torch.allclose(rotation.rotate(x), x @ rotation.matrix(), atol=1e-5)
    assert torch.allclose(rotation.rotate(rotation.rotate(x)), x, atol=1e-5)
    q, k = torch.randn(4, dim), torch.randn(6, dim)
    assert torch.allclose(rotation.rotate(q) @ rotation.rotate(k).T, q @ k.T, atol=1e-4)
    assert rotation.rotate(x.bfloat16()).dtype == torch.bfloat16


def test_rotation_spreads_an_outlier_channel():
    """What rotation buys: a per-tensor scale is set by the amax, and rotating brings the
    amax down towards the RMS (the norm is kept), so small values sit higher in FP8's range."""
    torch.manual_seed(0)
    k = torch.randn(256, 64)
    k[:, 3] *= 40  # one channel far larger than the rest, as in real keys
    rotated = HadamardRotation(64).rotate(k)
    assert torch.allclose(rotated.norm(dim=-1), k.norm(dim=-1), rtol=1e-4)
    assert rotated.abs().max() < k.abs().max() / 4


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rotation")
    return {family: make_checkpoint(family, root / family).path for family in FAMILIES}


def _logits(path, dtype, kv, rotation, chunk_size=None, path_override=None):
    llm = LLM(str(path), dtype=dtype, kv_cache_dtype=kv, kv_rotation=rotation)
    if path_override is not None:
        llm.engine.model.set_mla_path(path_override)
    return llm, llm.prompt_logits(PROMPT, chunk_size=chunk_size)


@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_is_exact_in_float32(family, family_dirs):
    plain_llm, plain = _logits(family_dirs[family], "float32", "auto", "none")
    rotated_llm, rotated = _logits(family_dirs[family], "float32", "auto", "hadamard")
    assert rotated_llm.engine.kv_rotation == "hadamard" and rotated_llm.engine.kv_rotation_detail
    assert (plain - rotated).abs().max().item() < FLOAT32_TOL
    # Decode steps (one token per step) too.
    _, decoded = _logits(family_dirs[family], "float32", "auto", "hadamard", chunk_size=1)
    assert (plain - decoded).abs().max().item() < FLOAT32_TOL
    # Not trivially equal: the cache really holds rotated values.
    stored = [llm.engine.pool.storage[0, : len(PROMPT)] for llm in (plain_llm, rotated_llm)]
    assert (stored[0] - stored[1]).abs().max().item() > 1e-2


@pytest.mark.parametrize("mla_path", ["absorbed", "expanded"])
def test_mla_rotation_is_exact_on_both_attention_paths(mla_path, family_dirs):
    path = family_dirs["kimi_k2"]
    _, plain = _logits(path, "float32", "auto", "none", path_override=mla_path)
    _, rotated = _logits(path, "float32", "auto", "hadamard", path_override=mla_path)
    assert (plain - rotated).abs().max().item() < FLOAT32_TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_rotation_in_bf16_changes_nothing_beyond_rounding(family, family_dirs):
    """BF16 weights and KV: the rotated model differs from the plain one by no more than
    BF16 itself differs from float32 (the rounding the rotation re-does).

    Compared by the median over positions of each row's mean |diff|: in the MoE families
    a rounding can move a token's router score across its top-k boundary, and that one
    row then differs by a whole expert's output (0.3 against 0.01 on the kimi_k2
    fixture, with torch's flash SDPA kernel in BF16), whichever run rounds that way."""
    path = family_dirs[family]
    _, exact = _logits(path, "float32", "auto", "none")
    _, plain = _logits(path, "bfloat16", "bf16", "none")
    _, rotated = _logits(path, "bfloat16", "bf16", "hadamard")

    def typical(diff: torch.Tensor) -> float:
        return diff.abs().mean(-1).median().item()

    rounding = typical(plain - exact)
    assert typical(rotated - plain) <= 1.5 * rounding
    assert typical(rotated - exact) <= 1.5 * rounding
    agree = (rotated.argmax(-1) == plain.argmax(-1)).float().mean().item()
    assert agree >= 0.9


def test_mla_rotates_the_latent_at_run_time_and_folds_only_kv_b(family_dirs):
    """The latent is rotated at run time and kv_b_proj holds the inverse; the projections
    before the cache stay as loaded (so a checkpoint's grid weights stay packed).
    Putting kv_b_proj's unrotated weight back changes the output, so the test can fail."""
    path = family_dirs["kimi_k2"]
    _, plain = _logits(path, "float32", "auto", "none")
    llm = LLM(str(path), dtype="float32", kv_cache_dtype="auto", kv_rotation="hadamard")
    reference = LLM(str(path), dtype="float32", kv_cache_dtype="auto", kv_rotation="none")
    attn = llm.engine.model.model.layers[0].self_attn
    plain_attn = reference.engine.model.model.layers[0].self_attn
    for name in ("fused_qkv_a_proj", "q_b_proj", "o_proj"):
        assert torch.equal(getattr(attn, name).weight, getattr(plain_attn, name).weight), name
    assert not torch.allclose(attn.kv_b_proj.weight, plain_attn.kv_b_proj.weight)
    # The norm's gain moved into kv_b_proj with the rotation's inverse.
    assert torch.equal(attn.kv_a_layernorm.weight, torch.ones_like(attn.kv_a_layernorm.weight))
    with torch.no_grad():
        attn.kv_b_proj.weight.copy_(plain_attn.kv_b_proj.weight)  # the fold undone
    assert (llm.prompt_logits(PROMPT) - plain).abs().max().item() > 1e-3


@pytest.mark.parametrize("dim", [64, 96])
def test_batch_invariant_rotation_matches_the_product(dim):
    torch.manual_seed(1)
    x = torch.randn(9, 4, dim)
    fast, exact_rows = HadamardRotation(dim), HadamardRotation(dim, batch_invariant=True)
    assert torch.allclose(exact_rows.rotate(x), fast.rotate(x), atol=1e-5)
    # Each row's result does not depend on the other rows.
    assert torch.equal(exact_rows.rotate(x[:1]), exact_rows.rotate(x)[:1])


def test_auto_rotation_is_hadamard_for_fp8_only(family_dirs):
    path = str(family_dirs["llama"])
    assert LLM(path, dtype="float32", kv_cache_dtype="fp8_e4m3").engine.kv_rotation == "hadamard"
    assert LLM(path, dtype="float32", kv_cache_dtype="auto").engine.kv_rotation == "none"
