"""Paged GQA decode (split-K + merge) against the torch backend and a float64 reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from engine.attention.triton.common import plan_splits, step_tables  # noqa: E402
from engine.attention.triton.decode import BLOCK_N, gqa_decode  # noqa: E402
from tests.engine.triton.cases import (  # noqa: E402
    LAYER,
    gqa_case,
    reference_attention,
    torch_and_triton,
    written_rows,
)

# Both backends read the same stored values; only summation order differs.
FP32_TOL = dict(atol=2e-5, rtol=1e-4)
# bf16 activations: both round their output to bf16 (one ulp is 2^-8 relative).
BF16_TOL = dict(atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    "q_heads, kv_heads, head_dim, page, context_lens, kv_dtype",
    [
        (2, 2, 16, 4, [1, 17, 40], "fp8_e4m3"),  # group 1, odd lengths, page boundaries
        (8, 2, 32, 16, [5, 16, 33], "fp8_e4m3"),  # group 4, lengths at and past a page
        (8, 1, 16, 4, [70, 3], "bf16"),  # group 8
        (8, 2, 24, 16, [9, 31], "fp8_e4m3"),  # head_dim below the tile: masked columns
    ],
)
def test_decode_matches_torch_backend(
    seed, device, q_heads, kv_heads, head_dim, page, context_lens, kv_dtype
):
    case = gqa_case(
        q_heads, kv_heads, head_dim, page, [1] * len(context_lens), context_lens, kv_dtype, device
    )
    assert case.meta.decode_only
    out, ref = torch_and_triton(case)
    torch.testing.assert_close(out, ref, **FP32_TOL)
    slots = case.meta.slot_mapping
    assert torch.equal(
        written_rows(case.pools[1], LAYER, slots), written_rows(case.pools[0], LAYER, slots)
    )


def test_decode_bf16_activations(seed, device):
    case = gqa_case(8, 2, 32, 16, [1, 1], [23, 50], "fp8_e4m3", device, dtype=torch.bfloat16)
    out, ref = torch_and_triton(case)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), **BF16_TOL)


@pytest.mark.parametrize("split_tokens", [BLOCK_N, 2 * BLOCK_N])
def test_split_decode_with_per_head_scales_matches_reference(seed, device, split_tokens):
    """Splits (some past the end of the shorter sequences) merge to the exact result.

    Per-KV-head scales, not powers of two, go straight to the kernel, as
    `pool.layer_scales` will hand them over; the reference dequantizes with them.
    """
    q_heads, kv_heads, head_dim, page = 8, 2, 16, 4
    lens = [100, 1, 37]
    case = gqa_case(q_heads, kv_heads, head_dim, page, [1] * 3, lens, "fp8_e4m3", device)
    pool, meta = case.pools[1], case.meta
    storage = pool.storage[LAYER]
    storage.copy_(torch.randint(0, 256, storage.shape, dtype=torch.int32).to(torch.uint8))
    storage[(storage & 0x7F) == 0x7F] = 0  # no NaN codes in the cache
    k_scales = torch.rand(kv_heads, device=device) * 0.1 + 1e-3
    v_scales = torch.rand(kv_heads, device=device) * 0.1 + 1e-3
    tables = step_tables(meta, page)
    poisoned = torch.full_like(case.q, float("nan"))
    args = (case.q, storage, tables, k_scales, v_scales, case.scale)
    # The widening path: exact up to summation order (test_decode_fp8_dot.py: e4m3 dots).
    out = gqa_decode(*args, out=poisoned, split_tokens=split_tokens, fp8_dot=False)
    splits, _ = plan_splits(3 * kv_heads, max(lens), BLOCK_N, 1, split_tokens)
    assert splits == -(-max(lens) // split_tokens) > 1
    assert not out.isnan().any()
    for b, length in enumerate(lens):
        stored = storage[meta.context_slots[b, :length]].view(torch.float8_e4m3fn).float()
        keys = stored[:, 0] * k_scales.view(1, -1, 1)
        values = stored[:, 1] * v_scales.view(1, -1, 1)
        ref = reference_attention(case.q[b : b + 1].float(), keys, values, case.scale)
        torch.testing.assert_close(out[b : b + 1], ref, **FP32_TOL)


def test_plan_splits_fills_the_gpu_and_covers_the_context():
    # One sequence of 32k on 132 SMs: cut into splits of at least 256 tokens.
    splits, size = plan_splits(8, 32768, 32, 132)
    assert splits * size >= 32768 and size % 32 == 0 and size >= 256 and splits > 1
    # A big batch fills the GPU alone: no split.
    assert plan_splits(64 * 8, 32768, 32, 132) == (1, 32768)
    # Short contexts are never split below MIN_SPLIT_TOKENS.
    assert plan_splits(1, 100, 32, 132)[0] == 1


def test_padding_rows_in_the_step_are_ignored(seed, device):
    """A query whose context is one token attends to exactly that token's value."""
    case = gqa_case(4, 2, 16, 4, [1, 1], [1, 9], "bf16", device)
    out = TritonAttentionBackend().forward(
        LAYER, case.q, case.k, case.v, case.pools[1], case.meta, case.scale
    )
    expected = case.v[0].repeat_interleave(2, dim=0)  # [Hq, D]: softmax over one key is 1
    torch.testing.assert_close(out[0], expected, **FP32_TOL)
