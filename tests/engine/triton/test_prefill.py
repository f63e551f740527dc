"""Prefill over a cached, paged prefix (causal) against the torch backend and a float64 reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.triton.common import step_tables  # noqa: E402
from engine.attention.triton.prefill import prefill_attention  # noqa: E402
from tests.engine.triton.cases import (  # noqa: E402
    LAYER,
    gqa_case,
    reference_attention,
    torch_and_triton,
    written_rows,
)

FP32_TOL = dict(atol=2e-5, rtol=1e-4)  # same stored values, different summation order
BF16_TOL = dict(atol=1e-2, rtol=1e-2)  # both round the output to bf16


@pytest.mark.parametrize(
    "q_heads, kv_heads, head_dim, page, query_lens, context_lens, kv_dtype",
    [
        (4, 4, 16, 16, [33], [33], "bf16"),  # one fresh prompt, group 1, two query tiles
        (8, 2, 16, 4, [5, 20, 1], [5, 37, 9], "fp8_e4m3"),  # prefixes, a decode row, group 4
        (8, 1, 32, 16, [17, 3], [40, 3], "fp8_e4m3"),  # group 8, prefix crossing pages
        (8, 2, 24, 4, [7, 18], [30, 18], "bf16"),  # head_dim below the tile
    ],
)
def test_prefill_matches_torch_backend(
    seed, device, q_heads, kv_heads, head_dim, page, query_lens, context_lens, kv_dtype
):
    case = gqa_case(q_heads, kv_heads, head_dim, page, query_lens, context_lens, kv_dtype, device)
    assert not case.meta.decode_only
    out, ref = torch_and_triton(case)
    torch.testing.assert_close(out, ref, **FP32_TOL)
    slots = case.meta.slot_mapping
    assert torch.equal(
        written_rows(case.pools[1], LAYER, slots), written_rows(case.pools[0], LAYER, slots)
    )


def test_prefill_bf16_activations(seed, device):
    case = gqa_case(8, 2, 32, 16, [19, 4], [19, 40], "fp8_e4m3", device, dtype=torch.bfloat16)
    out, ref = torch_and_triton(case)
    torch.testing.assert_close(out.float(), ref.float(), **BF16_TOL)


def test_prefill_with_per_head_scales_matches_reference(seed, device):
    """Every output row is written (poisoned buffer) and each query sees only its past."""
    query_lens, context_lens, page = [6, 21], [26, 21], 4
    case = gqa_case(8, 2, 16, page, query_lens, context_lens, "fp8_e4m3", device)
    pool, meta = case.pools[1], case.meta
    storage = pool.storage[LAYER]
    storage.copy_(torch.randint(0, 256, storage.shape, dtype=torch.int32).to(torch.uint8))
    storage[(storage & 0x7F) == 0x7F] = 0
    k_scales = torch.rand(2, device=device) * 0.1 + 1e-3
    v_scales = torch.rand(2, device=device) * 0.1 + 1e-3
    poisoned = torch.full_like(case.q, float("nan"))
    out = prefill_attention(
        case.q, storage, step_tables(meta, page), k_scales, v_scales, case.scale, out=poisoned
    )
    assert not out.isnan().any()
    start = 0
    for b, (n, length) in enumerate(zip(query_lens, context_lens, strict=True)):
        stored = storage[meta.context_slots[b, :length]].view(torch.float8_e4m3fn).float()
        keys = stored[:, 0] * k_scales.view(1, -1, 1)
        values = stored[:, 1] * v_scales.view(1, -1, 1)
        ref = reference_attention(case.q[start : start + n].float(), keys, values, case.scale)
        torch.testing.assert_close(out[start : start + n], ref, **FP32_TOL)
        start += n
