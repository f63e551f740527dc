"""The Triton backend with the pool's scale life cycle: calibration, observation, per-head scales."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from engine.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from engine.kv.pool import PagedKVPool  # noqa: E402
from tests.engine.triton.cases import LAYER, gqa_case, written_rows  # noqa: E402

FP32_TOL = dict(atol=2e-5, rtol=1e-4)
per_head_pools = pytest.mark.skipif(
    "per_head_scales" not in inspect.signature(PagedKVPool).parameters,
    reason="this PagedKVPool has no per-KV-head scales",
)


def test_first_write_calibrates_through_the_pool(seed, device):
    """An uncalibrated FP8 layer is written by the pool (which sets its scales), then read."""
    case = gqa_case(4, 2, 16, 4, [9, 1], [9, 12], "fp8_e4m3", device)
    pool = case.pools[1]
    pool._calibrated[LAYER] = False  # as a fresh pool's layer is before its first prefill
    before = pool.scales()
    out = TritonAttentionBackend().forward(
        LAYER, case.q, case.k, case.v, pool, case.meta, case.scale
    )
    assert pool._calibrated[LAYER] and pool.scales() != before
    # The torch backend on the same (now calibrated) pool reads the same bytes.
    ref = TorchAttentionBackend().forward(
        LAYER, case.q, case.k, case.v, pool, case.meta, case.scale
    )
    torch.testing.assert_close(out, ref, **FP32_TOL)


def test_observing_pool_sees_every_write(seed, device):
    case = gqa_case(4, 2, 16, 4, [1, 1], [5, 9], "fp8_e4m3", device)
    pool = case.pools[1]
    if not hasattr(pool, "observe"):
        pytest.skip("this PagedKVPool does not observe writes")
    pool.observe()
    TritonAttentionBackend().forward(LAYER, case.q, case.k, case.v, pool, case.meta, case.scale)
    k_amax = pool._observed[0][LAYER]
    assert torch.equal(k_amax.max(), case.k.abs().max().to(k_amax.device))


@per_head_pools
@pytest.mark.parametrize("query_lens, context_lens", [([1, 1, 1], [3, 17, 30]), ([6, 1], [6, 21])])
def test_per_head_scales_match_torch_backend(seed, device, query_lens, context_lens):
    """Per-KV-head scales reach the kernels through pool.layer_scales unchanged."""
    case = gqa_case(8, 2, 16, 4, query_lens, context_lens, "fp8_e4m3", device)
    pools = []
    for source in case.pools:
        pool = PagedKVPool(
            source.layout, source.num_pages, source.page_size, "fp8_e4m3", device,
            per_head_scales=True,
        )  # fmt: skip
        pool.storage.copy_(source.storage)  # bytes stay; only their scales change
        pools.append(pool)
    # Powers of two (exact quantization), different for every head.
    k_scale, v_scale = (2.0 ** -(torch.randperm(6)[:4] + 2).float().view(2, 2) for _ in "kv")
    for pool in pools:
        pool.set_scales(k_scale, v_scale, "test")
    assert pools[1].layer_scales(LAYER)[0].tolist() == k_scale[LAYER].tolist()
    k = case.k / case.pools[0].k_scale[LAYER] * k_scale[LAYER].view(-1, 1).to(device)
    v = case.v / case.pools[0].v_scale[LAYER] * v_scale[LAYER].view(-1, 1).to(device)
    args = (LAYER, case.q, k, v)
    ref = TorchAttentionBackend().forward(*args, pools[0], case.meta, case.scale)
    triton_backend = TritonAttentionBackend()
    triton_backend.fp8_dot = False  # widen as torch does: equal up to summation order
    out = triton_backend.forward(*args, pools[1], case.meta, case.scale)
    torch.testing.assert_close(out, ref, **FP32_TOL)
    slots = case.meta.slot_mapping
    assert torch.equal(written_rows(pools[1], LAYER, slots), written_rows(pools[0], LAYER, slots))
