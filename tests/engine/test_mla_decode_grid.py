"""MLA decode with W_UK and W_UV as grid weights (a GGUF file's attn_k_b / attn_v_b),
the latent's gain and rotation applied at run time, against the dense kernel path with
the same weights folded into kv_b_proj as the model folds them.

Tolerance. The grid path quantizes two activations to int8 per group of 32 (the
queries' nope part before W_UK, the attention's latent output before W_UV): each
carries up to half a step of amax / 127 per value, so an output may move by about
1% of the largest; the bound is 2%, and a wrong gain or rotation is off by far more.
"""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_backend import CPUAttentionBackend
from engine.cpu_kernels import library
from engine.cpu_kernels.mla_decode import LatentGrid, mla_decode_grid
from engine.kv.rotation import HadamardRotation
from engine.layers.cpu_grid_weights import GridWeight, pack_if_on_grid
from engine.weights.grid_rounding import GRIDS
from tests.engine.test_mla_decode_kernel import LAYER, _decode_step

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)

GRID_TOL = 0.02  # of the largest output (module docstring; 0.5-0.85% measured)
SHAPE = (4, 128, 64, 128, 512)  # heads, nope, rope, v, lora_rank: Kimi's head widths
LENS = [1, 37, 300]


def _grid(values: torch.Tensor) -> GridWeight:
    packed = pack_if_on_grid(values, kernel="int8")
    assert isinstance(packed, GridWeight)
    return packed


def _weights(dims, grid: str, gain, rotation):
    """Random W_UK / W_UV on `grid`, as LatentGrid and as the kv_b_proj the model would
    hold (gain and rotation folded: W' = W diag(g) H)."""
    gen = torch.Generator().manual_seed(1)
    h, nope, v, r = dims.num_heads, dims.nope_dim, dims.v_dim, dims.lora_rank
    round_to = GRIDS[grid]
    k_b = round_to(torch.randn(h * r, nope, generator=gen) * nope**-0.5)  # W_UK^T per head
    v_b = round_to(torch.randn(h * v, r, generator=gen) * r**-0.5)
    w_uk = k_b.view(h, r, nope).transpose(1, 2)  # [h, nope, r]
    kv_b = torch.cat([w_uk, v_b.view(h, v, r)], dim=1).reshape(h * (nope + v), r)
    if gain is not None:
        kv_b = kv_b * gain
    if rotation is not None:
        kv_b = kv_b @ rotation.matrix()
    kb, vb = _grid(k_b), _grid(v_b)
    return LatentGrid(kb, vb, gain, rotation.block if rotation is not None else 0), kv_b


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("grid", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("rotated", [False, True], ids=["plain", "gain+rotation"])
def test_grid_weights_match_the_folded_dense_path(kv_dtype, grid, rotated):
    q_nope, q_rope, latent, k_rope, _, pool, meta, dims = _decode_step(kv_dtype, SHAPE, LENS)
    gain = rotation = None
    if rotated:
        gain = torch.rand(dims.lora_rank, generator=torch.Generator().manual_seed(2)) + 0.5
        rotation = HadamardRotation(dims.lora_rank)
    weights, kv_b = _weights(dims, grid, gain, rotation)
    step = (q_nope, q_rope, latent, k_rope)
    scale = (dims.nope_dim + dims.rope_dim) ** -0.5
    want = (
        CPUAttentionBackend()
        .mla_decode(LAYER, *step, kv_b.to(q_nope.dtype), pool, meta, dims, scale)
        .float()
    )
    factors = pool.dequant_factors(LAYER)
    args = (pool.storage[LAYER], meta.context_slots, meta.context_lengths(), *factors, scale)
    got = mla_decode_grid(q_nope, q_rope, weights, *args)
    assert got.dtype == q_nope.dtype and got.shape == want.shape
    largest = want.abs().max()
    assert (got.float() - want).abs().max() <= GRID_TOL * largest
    if rotated:  # the run-time gain and rotation are what make it agree
        plain = LatentGrid(weights.k_b, weights.v_b)
        wrong = mla_decode_grid(q_nope, q_rope, plain, *args)
        assert (wrong.float() - want).abs().max() > 10 * GRID_TOL * largest


def test_shapes_the_kernel_does_not_take_are_refused():
    q_nope, q_rope, _, _, _, pool, meta, dims = _decode_step("bf16", SHAPE, [5])
    weights, _ = _weights(dims, "q8_0", None, None)
    weights.block = 24  # not a power of two
    args = (pool.storage[LAYER], meta.context_slots, meta.context_lengths(), 1.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="do not fit"):
        mla_decode_grid(q_nope, q_rope, weights, *args)
