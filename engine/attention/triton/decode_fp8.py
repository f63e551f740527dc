"""GQA decode over FP8 pages on e4m3 tensor cores: keys and values never widened.

The widening kernel (decode.py) converts each stored byte to bf16 and
multiplies a [group, head_dim] query tile by it. That keeps the group of
query heads as the dot's rows, which are few (12 for GLM-4.5, padded to 16),
and Triton compiles a dot of 16 rows on Hopper to `mma.sync` on fp16
operands, converting every e4m3 byte first. Here the products are swapped:

    scores^T [BLOCK_N, G] = K [BLOCK_N, D] . q^T [D, G]
    out^T    [D, G]       = V^T [D, BLOCK_N] . p^T [BLOCK_N, G]

so the context positions (64 a tile) and the head dimension are the rows,
and sm_90 runs both as `wgmma ... m64n16k32 .e4m3.e4m3` straight from the
stored bytes (checked in the compiled PTX; engine/devtools/kernel_check compiles every
configuration). The query is quantized once per program, each head with its
own scale (largest magnitude -> 448), and the softmax weights are rounded to
e4m3 times P_FP8_SCALE for the PV dot; engine.devtools.testing.fp8_decode_bound
derives the error this adds and the tests hold the kernel to it.

This module holds the loop; decode.py's kernel runs it when FP8_DOT is set,
so splits, pad rows, the partial outputs and the merge are shared, and a
CUDA graph captures it as it does the widening loop.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.attention.triton.common import (
    FP8_MAX_VALUE,
    P_FP8_SCALE_VALUE,
    paged_tile,
    probabilities_e4m3,
    quantize_rows_e4m3,
)

# Context positions per tile: the rows of both dots. wgmma wants 64 rows a warpgroup.
FP8_BLOCK_N = 64
FP8_NUM_WARPS = 4


@triton.jit
def attend_fp8(
    q, kv_base, stride_kind, stride_slot, table, start, end, score_scale, d, d_mask,
    BLOCK_G: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One split's softmax over FP8 pages with e4m3 operands, for decode.py's kernel:
    (acc [BLOCK_G, BLOCK_D] in value units, m_i, l_i) from the fp32 queries q
    [BLOCK_G, BLOCK_D] of one KV head's group and their per-head `score_scale`
    (softmax scale, log2(e), K dequant scale)."""
    q8, q_scale = quantize_rows_e4m3(q, FP8_MAX_VALUE)
    q8_t = tl.trans(q8)  # [BLOCK_D, BLOCK_G]: the dots' columns are the query heads
    head_scale = q_scale * score_scale  # each head's own query scale joins its scores
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([d.shape[0], BLOCK_G], tl.float32)  # out^T
    for n0 in range(start, end, BLOCK_N):
        offsets, n_mask, tile_mask = paged_tile(
            table, n0, end, stride_slot, d, d_mask, PAGE_SIZE, BLOCK_N
        )
        k = tl.load(kv_base + offsets, mask=tile_mask, other=0).to(tl.float8e4nv, bitcast=True)
        scores = tl.dot(k, q8_t) * head_scale[None, :]  # [BLOCK_N, BLOCK_G]
        scores = tl.where(n_mask[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)  # the fp32 weights, not their e4m3 copies
        v = tl.load(kv_base + stride_kind + offsets, mask=tile_mask, other=0)
        v = v.to(tl.float8e4nv, bitcast=True)
        acc = acc * alpha[None, :] + tl.dot(tl.trans(v), probabilities_e4m3(p))
        m_i = m_new
    # Back to [heads, dims] (once a program) and to value units: the e4m3 weights were
    # P_FP8_SCALE (a power of two: exact) times the fp32 ones l_i sums.
    return tl.trans(acc) * (1.0 / P_FP8_SCALE_VALUE), m_i, l_i
