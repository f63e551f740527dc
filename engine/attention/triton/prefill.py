"""Prefill attention: a chunk of queries per sequence over its paged context, causal.

The context is the sequence's cached prefix plus this chunk, read back from
the pool after the write (DESIGN.md §3: in fp8 mode the chunk's own tokens
are seen quantized too), so a prompt computes the same function whether it
was prefilled at once, in chunks, or found in the prefix cache. Sequences of
different lengths share one launch: queries sit flat in [T, Hq, D] and each
sequence's run starts at `query_starts[b]`; the query at chunk row m has
absolute position `seq_len - query_len + m` and sees keys at positions up to
and including it. A program handles BLOCK_M queries of one head and stops
reading keys after the last position its rows can see. Steps that mix
prefill and decode sequences run here too (a decode row is a chunk of one).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting
from engine.attention.triton.common import LOG2E, StepTables, block_size, dot_config, load_as

NUM_WARPS = 4


def tile_sizes() -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): tensor-core sized on a GPU, the minimum dot size in the interpreter."""
    return (16, 16) if interpreting() else (64, 64)


@triton.jit
def _prefill_kernel(
    q_ptr,
    kv_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_lens_ptr,
    query_starts_ptr,
    k_scale_ptr,
    v_scale_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_slot,
    stride_kind,
    stride_head,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Query heads vary fastest: the GROUP heads that share a KV head run together
    # and read its pages once from memory, then from L2.
    head = tl.program_id(0)
    m_block = tl.program_id(1)
    seq = tl.program_id(2)
    query_len = tl.load(query_lens_ptr + seq)
    if m_block * BLOCK_M >= query_len:
        return  # the grid covers the longest chunk; this sequence's is shorter
    seq_len = tl.load(seq_lens_ptr + seq)
    first_token = tl.load(query_starts_ptr + seq).to(tl.int64)
    kv_head = head // GROUP

    m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_mask = m < query_len
    d_mask = d < HEAD_DIM
    q_pos = seq_len - query_len + m  # rows past the chunk see everything below `hi`: no NaN
    q_ptrs = q_ptr + (first_token + m)[:, None] * stride_qt + head * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0).to(DOT)
    score_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
    v_scale = tl.load(v_scale_ptr + kv_head)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = kv_ptr + kv_head * stride_head
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    # The last row of this block sits at position seq_len - query_len + (m_block+1)*BLOCK_M - 1.
    hi = tl.minimum(seq_len, seq_len - query_len + (m_block + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = pos < hi
        page = tl.load(table + pos // PAGE_SIZE, mask=n_mask, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
        offsets = slot[:, None] * stride_slot + d[None, :]
        tile_mask = n_mask[:, None] & d_mask[None, :]
        k = load_as(k_base + offsets, tile_mask, IS_FP8, DOT)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * score_scale
        visible = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        # Position 0 is visible to every row in the first tile, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_as(k_base + stride_kind + offsets, tile_mask, IS_FP8, DOT)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v, input_precision=PRECISION)
        m_i = m_new

    out = acc / l_i[:, None] * v_scale
    out_ptrs = out_ptr + (first_token + m)[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def prefill_attention(
    q: torch.Tensor,
    storage: torch.Tensor,
    tables: StepTables,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    softmax_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, Hq, D] (all sequences' chunks, flat) over storage [slots, 2, Hkv, D] -> [T, Hq, D]."""
    tokens, q_heads, head_dim = q.shape
    kv_heads = storage.shape[2]
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not group over {kv_heads} KV heads")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(tokens, q_heads, head_dim, dtype=q.dtype, device=q.device)
    block_m, block_n = tile_sizes()
    batch = tables.seq_lens.shape[0]
    dot, precision = dot_config(q.dtype)
    grid = (q_heads, triton.cdiv(tables.max_query_len, block_m), batch)
    _prefill_kernel[grid](
        q,
        storage,
        out,
        tables.block_tables,
        tables.seq_lens,
        tables.query_lens,
        tables.query_starts,
        k_scales,
        v_scales,
        softmax_scale * LOG2E,
        q.stride(0),
        q.stride(1),
        storage.stride(0),
        storage.stride(1),
        storage.stride(2),
        tables.block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=q_heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_size(head_dim),
        PAGE_SIZE=tables.page_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_FP8=storage.dtype == torch.uint8,
        DOT=dot,
        PRECISION=precision,
        num_warps=NUM_WARPS,
    )
    return out
