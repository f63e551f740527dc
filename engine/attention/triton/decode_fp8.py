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
stored bytes (checked in the compiled PTX; engine/kernel_check compiles every
configuration). The query is quantized once per program, each head with its
own scale (largest magnitude -> 448), and the softmax weights are rounded to
e4m3 times P_FP8_SCALE for the PV dot; engine.testing.fp8_decode_bound
derives the error this adds and the tests hold the kernel to it.

Splits, pad rows and the merge are decode.py's: the same `split_range`, the
same partial buffers and `merge_splits`, so a CUDA graph captures this
kernel as it does the other.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.attention.triton.common import (
    FP8_MAX_VALUE,
    P_FP8_SCALE_VALUE,
    probabilities_e4m3,
    quantize_rows_e4m3,
    split_range,
)

# Context positions per tile: the rows of both dots. wgmma wants 64 rows a warpgroup.
FP8_BLOCK_N = 64
FP8_NUM_WARPS = 4


@triton.jit
def gqa_decode_fp8_split_kernel(
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    k_scale_ptr,
    v_scale_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,
    fixed_split,
    stride_qt,
    stride_qh,
    stride_slot,
    stride_kind,
    stride_head,
    stride_bt,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start, end = split_range(seq_len, split, tl.num_programs(2), fixed_split, BLOCK_N, MIN_SPLIT)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_ptrs = q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    q8, q_scale = quantize_rows_e4m3(q, FP8_MAX_VALUE)
    q8_t = tl.trans(q8)  # [BLOCK_D, BLOCK_G]: the dot's columns are the query heads
    # Per head: the query's scale, the K dequant scale, softmax scale and log2(e).
    head_scale = q_scale * (qk_scale * tl.load(k_scale_ptr + kv_head))
    v_scale = tl.load(v_scale_ptr + kv_head)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_D, BLOCK_G], tl.float32)  # out^T
    base = kv_ptr + kv_head * stride_head
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = pos < end
        page = tl.load(table + pos // PAGE_SIZE, mask=n_mask, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        offsets = slot[:, None] * stride_slot + d[None, :]
        tile_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(base + offsets, mask=tile_mask, other=0).to(tl.float8e4nv, bitcast=True)
        scores = tl.dot(k, q8_t) * head_scale[None, :]  # [BLOCK_N, BLOCK_G]
        scores = tl.where(n_mask[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        v = tl.load(base + stride_kind + offsets, mask=tile_mask, other=0)
        v = v.to(tl.float8e4nv, bitcast=True)
        acc = acc * alpha[None, :] + tl.dot(tl.trans(v), probabilities_e4m3(p))
        m_i = m_new

    # As decode.py: a split that saw nothing has lse -inf and a zero output. The
    # e4m3 weights were P_FP8_SCALE times the fp32 ones that l_i sums.
    seen = l_i > 0
    denom = tl.where(seen, l_i, 1.0) * P_FP8_SCALE_VALUE
    out = acc / denom[None, :] * v_scale
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    part = part_out_ptr + seq.to(tl.int64) * stride_pb + split * stride_ps
    tl.store(
        part + heads[None, :] * stride_ph + d[:, None],
        out,
        mask=g_mask[None, :] & d_mask[:, None],
    )
    lse_ptrs = part_lse_ptr + seq.to(tl.int64) * stride_lb + heads * stride_lh + split
    tl.store(lse_ptrs, lse, mask=g_mask)
