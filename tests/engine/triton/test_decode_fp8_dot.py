"""GQA decode on FP8 tensor cores (queries and softmax weights as e4m3) against float64.

The reference and the derived error bound are engine.devtools.testing.fp8_decode_bound's
(its docstring derives the bound); bench/gpu_check.py checks the real shapes
with them on a GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.triton.decode import gqa_decode  # noqa: E402
from engine.devtools.testing.fp8_decode_bound import (  # noqa: E402
    BF16_OUTPUT_ROUNDING,
    excess_over_bound,
    gqa_reference_and_bound,
)
from tests.engine.triton.test_decode_splits import (  # noqa: E402
    MIXED_LENS,
    gqa_step,
    slots_of,
)


def reference_and_bound(q, storage, tables, k_scales, v_scales, softmax_scale, row):
    stored = storage[slots_of(tables, row)]
    return gqa_reference_and_bound(q[row], stored, k_scales, v_scales, softmax_scale)


def assert_within_bound(out, ref, bound, rounding=0.0):
    excess = excess_over_bound(out, ref, bound, rounding)
    assert excess <= 0, f"error over the bound by up to {excess:.3g}"


# Pad rows hold NaN queries (a graph's static buffer may); their scale is NaN and unused.
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group, head_dim", [(4, 16), (1, 32), (3, 24)])
def test_fp8_dot_is_within_the_weights_rounding_of_float64(seed, device, dtype, group, head_dim):
    step = gqa_step(
        MIXED_LENS, "fp8_e4m3", dtype, device, kv_heads=2, group=group, head_dim=head_dim
    )
    out = gqa_decode(*step, fp8_dot=True)
    assert not out.isnan().any()
    rounding = BF16_OUTPUT_ROUNDING if dtype == torch.bfloat16 else 0.0
    for row, length in enumerate(MIXED_LENS):
        if length == 0:  # a pad row (NaN queries) comes out as zeros
            assert torch.equal(out[row], torch.zeros_like(out[row]))
            continue
        ref, bound = reference_and_bound(*step, row)
        assert_within_bound(out[row], ref, bound, rounding)


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")
def test_fp8_dot_splits_merge_to_the_same_bound(seed, device):
    """Several splits per sequence (each quantizes its weights against its own running
    maximum) stay within the bound, as one split does."""
    step = gqa_step(MIXED_LENS, "fp8_e4m3", torch.float32, device, kv_heads=1, group=4)
    tables = dataclasses.replace(step[2], max_seq_len=max(MIXED_LENS))
    split = gqa_decode(*step[:2], tables, *step[3:], split_tokens=32, fp8_dot=True)
    for row, length in enumerate(MIXED_LENS):
        if length:
            assert_within_bound(split[row], *reference_and_bound(*step, row))


def test_the_query_scale_matters(seed, device):
    """Queries of very different sizes per head: each row's own scale keeps the small
    heads' queries exact to 3 mantissa bits. One scale for the whole tile (set by the
    3e4 head) leaves the first head's entries a few subnormal steps and fails the bound
    (checked by that mutation)."""
    q, storage, tables, k_scales, v_scales, softmax_scale = gqa_step(
        [64], "fp8_e4m3", torch.float32, device, kv_heads=1, group=4
    )
    q = q * torch.tensor([1.0, 4.0, 100.0, 3e4], device=device).view(1, 4, 1)
    out = gqa_decode(q, storage, tables, k_scales, v_scales, softmax_scale, fp8_dot=True)
    ref, bound = reference_and_bound(q, storage, tables, k_scales, v_scales, softmax_scale, 0)
    assert_within_bound(out[0], ref, bound)


def test_fp8_dot_needs_fp8_pages(device):
    step = gqa_step([5], "bf16", torch.float32, device)
    with pytest.raises(ValueError, match="FP8 pages"):
        gqa_decode(*step, fp8_dot=True)
    # BF16 pages never take it by default.
    torch.testing.assert_close(gqa_decode(*step), gqa_decode(*step, fp8_dot=False))
