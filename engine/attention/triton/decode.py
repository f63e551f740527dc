"""Paged decode attention for GQA: one query per sequence, split along the context.

Decode is bound by reading K and V, so each program reads one KV head's pages
once for all the query heads of its group (GROUP rows of one tl.dot, padded
to 16) and widens FP8 bytes to the dot dtype in registers; the per-head K
scale multiplies the fp32 scores and the V scale the output, never the
stored values. Long contexts with a small batch would leave most of the GPU
idle, so the context is cut into splits (flash-decoding): each program
writes its split's normalised output and log-sum-exp, and `merge_splits`
combines them. The merge is shared with MLA decode.

Split sizes are decided in two places, so decode can be captured as a CUDA
graph. The host plans only the split count S, the grid's last dimension,
with `plan_splits` from `tables.max_seq_len`: eager steps pass the longest
sequence, the graph runner the pool's capacity, which fixes the grid per
batch bucket. Each program then cuts its own sequence into up to S
whole-tile splits of equal size (`split_range`), so in a capacity-planned
grid a short sequence still spreads over several programs instead of
filling one, and an eager step gives the longest sequence the layout
`plan_splits` chose. Pad rows (seq_len 0, as a graph bucket is padded)
read nothing and come out as zeros. Given the tables, launching reads no
device tensor on the host (no .item(), no synchronisation), which graph
capture requires.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton.common import (
    LOG2E,
    StepTables,
    block_size,
    choose_fp8_dot,
    dot_config,
    load_as,
    min_split_tokens,
    paged_tile,
    plan_splits,
    split_range,
)
from engine.attention.triton.decode_fp8 import FP8_BLOCK_N, FP8_NUM_WARPS, attend_fp8
from engine.attention.triton.target import sm_count

BLOCK_N = 32  # context positions per tile
NUM_WARPS = 4


@triton.jit
def _attend_widened(
    q, kv_base, stride_kind, stride_slot, table, start, end, score_scale, d, d_mask,
    BLOCK_G: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_FP8: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One split's softmax with the stored values widened to DOT (BF16 pages, or FP8
    where e4m3 dots are off): (acc [BLOCK_G, BLOCK_D], m_i, l_i)."""
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, d.shape[0]], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offsets, n_mask, tile_mask = paged_tile(
            table, n0, end, stride_slot, d, d_mask, PAGE_SIZE, BLOCK_N
        )
        k = load_as(kv_base + offsets, tile_mask, IS_FP8, DOT)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * score_scale
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_as(kv_base + stride_kind + offsets, tile_mask, IS_FP8, DOT)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _gqa_decode_split_kernel(
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
    IS_FP8: tl.constexpr,
    FP8_DOT: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # This sequence's own split of the grid's tl.num_programs(2) (empty past its end).
    start, end = split_range(seq_len, split, tl.num_programs(2), fixed_split, BLOCK_N, MIN_SPLIT)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_ptrs = q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    # Softmax scale, log2(e) (exp2 below) and the K dequant scale, applied to fp32 scores.
    score_scale = qk_scale * tl.load(k_scale_ptr + kv_head)
    v_scale = tl.load(v_scale_ptr + kv_head)
    kv_base = kv_ptr + kv_head * stride_head
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    if FP8_DOT:  # e4m3 tensor cores on the stored bytes (decode_fp8.py)
        acc, m_i, l_i = attend_fp8(
            q.to(tl.float32), kv_base, stride_kind, stride_slot, table, start, end,
            score_scale, d, d_mask, BLOCK_G, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
    else:
        acc, m_i, l_i = _attend_widened(
            q.to(DOT), kv_base, stride_kind, stride_slot, table, start, end, score_scale, d,
            d_mask, BLOCK_G, PAGE_SIZE, BLOCK_N, IS_FP8, DOT, PRECISION,
        )  # fmt: skip

    # A split past the end of its sequence (every split of a pad row) saw
    # nothing: lse -inf, weight 0, output 0.
    seen = l_i > 0
    denom = tl.where(seen, l_i, 1.0)
    out = acc / denom[:, None] * v_scale
    lse = tl.where(seen, m_i + tl.log2(denom), float("-inf"))
    part = part_out_ptr + seq.to(tl.int64) * stride_pb + split * stride_ps
    tl.store(
        part + heads[:, None] * stride_ph + d[None, :],
        out,
        mask=g_mask[:, None] & d_mask[None, :],
    )
    lse_ptrs = part_lse_ptr + seq.to(tl.int64) * stride_lb + heads * stride_lh + split
    tl.store(lse_ptrs, lse, mask=g_mask)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ot,
    stride_oh,
    DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """out = sum_s w_s * part_s / sum_s w_s with w_s = 2^(lse_s - max lse).

    A pad row (seq_len 0) has lse -inf in every split: its output is 0, not 0/0.
    """
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    lse = tl.load(
        part_lse_ptr + seq * stride_lb + head * stride_lh + s,
        mask=s < num_splits,
        other=-float("inf"),
    )
    top = tl.max(lse, 0)
    # -inf only for a row that saw no token at all; 0 keeps its weights 2^-inf = 0.
    top = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(tl.exp2(lse - top), 0)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < DIM
    acc = tl.zeros([BLOCK_D], tl.float32)
    part = part_out_ptr + seq * stride_pb + head * stride_ph
    for split in range(0, num_splits):
        weight = tl.exp2(tl.load(part_lse_ptr + seq * stride_lb + head * stride_lh + split) - top)
        # Empty splits (many, in a grid planned for the capacity) weigh 0: skip their reads.
        if weight > 0:
            acc += weight * tl.load(part + split * stride_ps + d, mask=d_mask, other=0.0)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_ot + head * stride_oh + d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """part_out [B, H, S, D] fp32 and part_lse [B, H, S] (log2 units) -> out [B, H, D]."""
    batch, heads, splits, dim = part_out.shape
    _merge_splits_kernel[(batch, heads)](
        part_out,
        part_lse,
        out,
        splits,
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        DIM=dim,
        BLOCK_D=triton.next_power_of_2(dim),
        BLOCK_S=triton.next_power_of_2(splits),
    )


def split_buffers(
    batch: int, heads: int, splits: int, dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [B, H, S, D] and log-sum-exps [B, H, S], float32."""
    part_out = torch.empty(batch, heads, splits, dim, dtype=torch.float32, device=device)
    part_lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=device)
    return part_out, part_lse


def split_plan(
    batch: int,
    kv_heads: int,
    max_len: int,
    device: torch.device,
    split_tokens: int | None = None,
    fp8_dot: bool = False,
) -> tuple[int, int]:
    """(splits, tokens per split) of a decode step: one program per sequence and KV head
    per split (the compile check plans its merge widths with this too). `fp8_dot` is the
    loop the launch takes (`choose_fp8_dot`): the e4m3 one tiles FP8_BLOCK_N positions."""
    tile = FP8_BLOCK_N if fp8_dot else BLOCK_N
    return plan_splits(batch * kv_heads, max_len, tile, sm_count(device), split_tokens)


def gqa_decode_splits(
    q: torch.Tensor,
    storage: torch.Tensor,
    tables: StepTables,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    softmax_scale: float,
    split_tokens: int | None = None,
    fp8_dot: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernel alone: (part_out [B, Hq, S, D], part_lse [B, Hq, S]) before the merge.

    S is planned from `tables.max_seq_len`; each sequence covers its own
    length with up to S splits (`split_range`); lse is -inf where a split saw
    nothing. Reads no device tensor on the host, so it can be graph-captured.
    `fp8_dot` (`choose_fp8_dot`; None: where the GPU has FP8 tensor cores) runs
    FP8 pages through the e4m3 tensor-core loop (decode_fp8.py) instead of widening them.
    """
    batch, q_heads, head_dim = q.shape
    kv_heads = storage.shape[2]
    if q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not group over {kv_heads} KV heads")
    if q.stride(-1) != 1:
        q = q.contiguous()
    group = q_heads // kv_heads
    use_fp8_dot = choose_fp8_dot(q, storage, fp8_dot)
    # Read once: bench/gpu_check.py sweeps the modules' tiles.
    block_n = FP8_BLOCK_N if use_fp8_dot else BLOCK_N
    splits, split_size = split_plan(
        batch, kv_heads, tables.max_seq_len, q.device, split_tokens, use_fp8_dot
    )
    part_out, part_lse = split_buffers(batch, q_heads, splits, head_dim, q.device)
    dot, precision = dot_config(q.dtype)
    _gqa_decode_split_kernel[(batch, kv_heads, splits)](
        q,
        storage,
        tables.block_tables,
        tables.seq_lens,
        k_scales,
        v_scales,
        part_out,
        part_lse,
        softmax_scale * LOG2E,
        split_size if split_tokens is not None else 0,
        q.stride(0),
        q.stride(1),
        storage.stride(0),
        storage.stride(1),
        storage.stride(2),
        tables.block_tables.stride(0),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP=group,
        BLOCK_G=block_size(group),
        HEAD_DIM=head_dim,
        BLOCK_D=block_size(head_dim),
        PAGE_SIZE=tables.page_size,
        BLOCK_N=block_n,
        MIN_SPLIT=min_split_tokens(block_n),
        IS_FP8=storage.dtype == torch.uint8,
        FP8_DOT=use_fp8_dot,
        DOT=dot,
        PRECISION=precision,
        num_warps=FP8_NUM_WARPS if use_fp8_dot else NUM_WARPS,
    )
    return part_out, part_lse


def gqa_decode(
    q: torch.Tensor,
    storage: torch.Tensor,
    tables: StepTables,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    softmax_scale: float,
    out: torch.Tensor | None = None,
    split_tokens: int | None = None,
    fp8_dot: bool | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] (one query per sequence) over one layer's storage [slots, 2, Hkv, D] -> [B, Hq, D].

    k_scales / v_scales: float32 [Hkv] dequant scales (ones for BF16 storage).
    The split count comes from `tables.max_seq_len` (the longest sequence, or
    a CUDA graph's capacity), each sequence's split size from its own length;
    `split_tokens` fixes the split size instead (tests, benchmarks). Rows
    with seq_len 0 (graph padding) give zeros. No host synchronisation: the
    launch reads only Python ints and tensor shapes, never a device value.
    """
    args = (q, storage, tables, k_scales, v_scales, softmax_scale, split_tokens, fp8_dot)
    part_out, part_lse = gqa_decode_splits(*args)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    merge_splits(part_out, part_lse, out)
    return out
