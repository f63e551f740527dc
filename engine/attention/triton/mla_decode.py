"""MLA decode: absorbed queries over the paged latent rows, split along the context.

With W_UK folded into the query (engine/attention/mla.py), decode is
multi-query attention with one KV "head" per token: the 576-value latent row
`[c (lora_rank) | k_rope (rope_dim)]`. Scores are
`latent_scale * q_c·c + rope_scale * q_rope·k_rope`, and the values are the
latents themselves, so the output is `latent_scale * softmax · c`, still in
latent space; the caller applies W_UV. Each program reads its rows once for
BLOCK_H query heads (padded to 16 for tl.dot), and the context is split as in GQA decode, with the same merge:
the host plans the split count from `tables.max_seq_len` (the longest
sequence, or a CUDA graph's capacity, which fixes the grid per batch
bucket) and each program sizes its sequence's splits from that sequence's
own length (`split_range`), so a short sequence in a capacity-planned grid
still spreads over several programs. Pad rows (seq_len 0) give zeros, and
launching reads no device tensor on the host (graph capture allows none).

FP8 rows on a GPU with FP8 tensor cores (sm_89+) and bf16/fp16 queries take
the FP8_DOT path by default (`choose_fp8_dot`): the queries are quantized per head row to e4m3 and both
dots (scores = q·row, out = p·row) multiply the stored e4m3 bytes directly,
with fp32 accumulation, instead of widening every row to the activations'
dtype in registers, as the other path does (the scheme GQA decode uses too; docs/DECODE_ATTENTION.md, "FP8 on tensor cores").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting
from engine.attention.triton.common import (
    FP8_MAX_VALUE,
    LOG2E,
    P_FP8_SCALE_VALUE,
    StepTables,
    block_size,
    choose_fp8_dot,
    dot_config,
    load_as,
    min_split_tokens,
    plan_splits,
    probabilities_e4m3,
    quantize_rows_e4m3,
    split_range,
)
from engine.attention.triton.decode import merge_splits, split_buffers
from engine.attention.triton.target import sm_count

MIN_BLOCK_H = 16  # the smallest tl.dot row count
MAX_BLOCK_H = 32  # the most that compiles without spilling (below)
# tl.dot over 8-bit operands needs K >= 32 on NVIDIA GPUs (Triton's min_dot_size), so
# the FP8 path pads the latent and rope widths to at least 32; BLOCK_N, the PV dot's K,
# is 64 on a GPU (tile_config), and the interpreter checks no minimum.
FP8_MIN_K = 32


def head_block(heads: int) -> int:
    """Query heads per program (BLOCK_H). Each program reads its split's latent rows
    once for all its heads, so fewer head blocks read the cache fewer times: Kimi's 64
    heads in blocks of 32 read each row twice, not four times. The issue-28 sweep on an
    H200 measured FP8 MLA decode at 449 GB/s with 64 heads a program against 150-185 GB/s
    with 16; but 64 spills on sm_90 (392 B a thread at 8 warps, 960 B at 16: the
    [64, 512] fp32 accumulator), and the compile check refuses spills, while 32 fits
    (8 warps, one program per SM either way: 248 registers on the widening path over
    FP8 rows, 247 on the FP8 tensor-core path with its 64-row tiles). The interpreter
    keeps 16 (speed of the CPU tests)."""
    if interpreting():
        return MIN_BLOCK_H
    return min(MAX_BLOCK_H, block_size(heads, MIN_BLOCK_H))


def tile_config(fp8_dot: bool = False) -> tuple[int, int]:
    """(BLOCK_N, num_warps): a [BLOCK_N, 576] latent tile plus a [BLOCK_H, 512] fp32
    accumulator per program wants 8 warps on a GPU; the interpreter ignores warps.
    The FP8 tensor-core path reads 64 rows a tile: the M of its score dot, which
    Hopper's FP8 MMA needs to be a multiple of 64 (`_attend_fp8`)."""
    if interpreting():
        return 16, 4
    return (64, 8) if fp8_dot else (32, 8)


@triton.jit
def _tile_rows(
    rows_ptr, table, n0, end, stride_row, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Pointers to the latent rows of positions [n0, n0 + BLOCK_N) and which are < end."""
    pos = n0 + tl.arange(0, BLOCK_N)
    n_mask = pos < end
    page = tl.load(table + pos // PAGE_SIZE, mask=n_mask, other=0)
    return rows_ptr + (page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE) * stride_row, n_mask


@triton.jit
def _attend_widened(
    q_c, q_r, rows_ptr, table, start, end, stride_row, c_scale, r_scale, c, r,
    BLOCK_H: tl.constexpr, LORA: tl.constexpr, ROPE: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, IS_FP8: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """The split's softmax over rows widened to DOT: (acc [BLOCK_H, BLOCK_L], m_i, l_i)."""
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, c.shape[0]], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        row, n_mask = _tile_rows(rows_ptr, table, n0, end, stride_row, PAGE_SIZE, BLOCK_N)
        row = row[:, None]
        latent = load_as(row + c[None, :], n_mask[:, None] & (c < LORA)[None, :], IS_FP8, DOT)
        rope = load_as(row + LORA + r[None, :], n_mask[:, None] & (r < ROPE)[None, :], IS_FP8, DOT)
        scores = tl.dot(q_c, tl.trans(latent), input_precision=PRECISION) * c_scale
        scores += tl.dot(q_r, tl.trans(rope), input_precision=PRECISION) * r_scale
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), latent, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _attend_fp8(
    q8_c_t, q8_r_t, rows_ptr, table, start, end, stride_row, c_scales, r_scales, c, r,
    BLOCK_H: tl.constexpr, LORA: tl.constexpr, BLOCK_L: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The split's softmax with e4m3 operands on both dots, computed TRANSPOSED:
    (acc^T [BLOCK_L, BLOCK_H] times P_FP8_SCALE, m_i, l_i) from the e4m3 queries
    q8_c_t [BLOCK_L, BLOCK_H] and q8_r_t [BLOCK_R, BLOCK_H] and their scales
    c_scales / r_scales [1, BLOCK_H].

    Heads are the dots' N, not their M: Hopper's FP8 MMA (wgmma) needs M a multiple
    of 64, and a head block is 16 or 32 (a [64, 512] accumulator spills), while a tile
    of 64 rows (scores^T = rows · q^T) and the 512 latent columns (acc^T = rows^T · p^T)
    give it; with heads as M, Triton falls back to MMAv2, which on sm_90 widens e4m3 to
    fp16 (seen in the TTGIR). The stored bytes are the operands themselves, never
    widened: each tile is loaded once and written to shared memory twice, K-major for
    the scores and transposed for the PV dot (wgmma takes 8-bit operands K-major only).
    The queries come in transposed so that Triton stores them in shared memory once,
    before the loop (transposed inside it, they were stored again every tile).
    """
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_L, BLOCK_H], tl.float32)
    # Read the bytes as e4m3 through the pointer's type: both dots then take the tile from
    # shared memory (a bitcast after the load fed the score dot from registers: 4 to 7
    # more registers a thread, measured on sm_90).
    rows_ptr = rows_ptr.to(tl.pointer_type(tl.float8e4nv))
    for n0 in range(start, end, BLOCK_N):
        row, n_mask = _tile_rows(rows_ptr, table, n0, end, stride_row, PAGE_SIZE, BLOCK_N)
        row = row[:, None]
        latent_mask = n_mask[:, None] & (c < LORA)[None, :]
        latent = tl.load(row + c[None, :], mask=latent_mask, other=0.0)
        rope_mask = n_mask[:, None] & (r < ROPE)[None, :]
        rope = tl.load(row + LORA + r[None, :], mask=rope_mask, other=0.0)
        scores = tl.dot(latent, q8_c_t) * c_scales  # [BLOCK_N, BLOCK_H]
        scores += tl.dot(rope, q8_r_t) * r_scales
        scores = tl.where(n_mask[:, None], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)  # from the fp32 weights, not their e4m3 copies
        # The weights times P_FP8_SCALE as e4m3 (each within 2^-4 relative). The rescaled
        # accumulator goes into the dot itself: `acc * alpha + dot` would hold a second
        # [BLOCK_L, BLOCK_H] fp32 result beside it (spills at BLOCK_H 32 on sm_90).
        acc = tl.dot(tl.trans(latent), probabilities_e4m3(p), acc * alpha[None, :])
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _mla_decode_split_kernel(
    q_ptr,
    rows_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    qk_scale,
    latent_scale,
    rope_scale,
    fixed_split,
    stride_qb,
    stride_qh,
    stride_row,
    stride_bt,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    LORA: tl.constexpr,
    BLOCK_L: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
    IS_FP8: tl.constexpr,
    FP8_DOT: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Head blocks vary fastest, so the programs reading the same rows run together
    # and all but the first find them in L2.
    head_block = tl.program_id(0)
    seq = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # This sequence's own split of the grid's tl.num_programs(2) (empty past its end).
    start, end = split_range(seq_len, split, tl.num_programs(2), fixed_split, BLOCK_N, MIN_SPLIT)

    heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, BLOCK_L)
    r = tl.arange(0, BLOCK_R)
    h_mask = heads < NUM_HEADS
    c_mask = c < LORA
    q_row = q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q_c = tl.load(q_row + c[None, :], mask=h_mask[:, None] & c_mask[None, :], other=0.0)
    q_r = tl.load(q_row + LORA + r[None, :], mask=h_mask[:, None] & (r < ROPE)[None, :], other=0.0)
    # The two parts have their own dequant scales; both fold into fp32 scores.
    c_scale = qk_scale * latent_scale
    r_scale = qk_scale * rope_scale
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    part = part_out_ptr + seq.to(tl.int64) * stride_pb + split * stride_ps
    if FP8_DOT:
        # e4m3 queries, one scale per head row and per part: q_c (the query times W_UK)
        # and q_rope (the rotated rope query) come from different projections and can
        # differ in size by orders of magnitude. One scale per row would be set by the
        # larger part, leaving the smaller one few significant bits, or flushing it to
        # zero below e4m3's 2^-9 step; the parts are separate dots anyway, so a second
        # scale costs one row maximum per program and nothing in the loop.
        q8_c, q_c_scale = quantize_rows_e4m3(q_c.to(tl.float32), FP8_MAX_VALUE)
        q8_r, q_r_scale = quantize_rows_e4m3(q_r.to(tl.float32), FP8_MAX_VALUE)
        acc, m_i, l_i = _attend_fp8(
            tl.trans(q8_c), tl.trans(q8_r), rows_ptr, table, start, end, stride_row,
            (q_c_scale * c_scale)[None, :], (q_r_scale * r_scale)[None, :], c, r,
            BLOCK_H, LORA, BLOCK_L, ROPE, BLOCK_R, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
        seen = l_i > 0
        denom = tl.where(seen, l_i, 1.0)
        # P_FP8_SCALE (a power of two: exact) and l_i divided out; stored transposed back.
        out = acc / (denom * P_FP8_SCALE_VALUE)[None, :] * latent_scale
        out_ptrs = part + heads[None, :] * stride_ph + c[:, None]
        tl.store(out_ptrs, out, mask=c_mask[:, None] & h_mask[None, :])
    else:
        acc, m_i, l_i = _attend_widened(
            q_c.to(DOT), q_r.to(DOT), rows_ptr, table, start, end, stride_row, c_scale,
            r_scale, c, r, BLOCK_H, LORA, ROPE, PAGE_SIZE, BLOCK_N, IS_FP8, DOT, PRECISION,
        )  # fmt: skip
        seen = l_i > 0
        denom = tl.where(seen, l_i, 1.0)
        out = acc / denom[:, None] * latent_scale
        out_ptrs = part + heads[:, None] * stride_ph + c[None, :]
        tl.store(out_ptrs, out, mask=h_mask[:, None] & c_mask[None, :])
    lse = tl.where(seen, m_i + tl.log2(denom), float("-inf"))
    lse_ptrs = part_lse_ptr + seq.to(tl.int64) * stride_lb + heads * stride_lh + split
    tl.store(lse_ptrs, lse, mask=h_mask)


def split_plan(
    batch: int,
    heads: int,
    max_len: int,
    device: torch.device,
    split_tokens: int | None = None,
    fp8_dot: bool = False,
) -> tuple[int, int]:
    """(splits, tokens per split) of an MLA decode step: one program per sequence and block
    of `head_block(heads)` heads per split (the compile check plans its merge widths with this
    too). `fp8_dot` is the path the launch takes (`choose_fp8_dot`): its tiles are longer."""
    block_n, _ = tile_config(fp8_dot)
    programs = batch * triton.cdiv(heads, head_block(heads))
    return plan_splits(programs, max_len, block_n, sm_count(device), split_tokens)


def mla_decode_splits(
    q: torch.Tensor,
    rows: torch.Tensor,
    tables: StepTables,
    lora_rank: int,
    latent_scale: float,
    rope_scale: float,
    softmax_scale: float,
    split_tokens: int | None = None,
    fp8_dot: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernel alone: (part_out [B, H, S, lora_rank], part_lse [B, H, S]) before the merge.

    S is planned from `tables.max_seq_len`; each sequence covers its own
    length with up to S splits (`split_range`); lse is -inf where a split saw
    nothing. Reads no device tensor on the host, so it can be graph-captured.
    `fp8_dot` chooses the dots' operands as `choose_fp8_dot` (common.py) says.
    """
    batch, heads, width = q.shape
    if rows.shape[-1] != width:
        raise ValueError(f"queries of width {width} over latent rows of {rows.shape[-1]}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    rope_dim = width - lora_rank
    fp8 = choose_fp8_dot(q, rows, fp8_dot)
    min_k = FP8_MIN_K if fp8 else 16
    block_h = head_block(heads)
    block_n, num_warps = tile_config(fp8)
    head_blocks = triton.cdiv(heads, block_h)
    splits, split_size = split_plan(
        batch, heads, tables.max_seq_len, q.device, split_tokens, fp8_dot=fp8
    )
    part_out, part_lse = split_buffers(batch, heads, splits, lora_rank, q.device)
    dot, precision = dot_config(q.dtype)
    _mla_decode_split_kernel[(head_blocks, batch, splits)](
        q,
        rows,
        tables.block_tables,
        tables.seq_lens,
        part_out,
        part_lse,
        softmax_scale * LOG2E,
        float(latent_scale),
        float(rope_scale),
        split_size if split_tokens is not None else 0,
        q.stride(0),
        q.stride(1),
        rows.stride(0),
        tables.block_tables.stride(0),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        NUM_HEADS=heads,
        BLOCK_H=block_h,
        LORA=lora_rank,
        BLOCK_L=block_size(lora_rank, min_k),
        ROPE=rope_dim,
        BLOCK_R=block_size(rope_dim, min_k),
        PAGE_SIZE=tables.page_size,
        BLOCK_N=block_n,
        MIN_SPLIT=min_split_tokens(block_n),
        IS_FP8=rows.dtype == torch.uint8,
        FP8_DOT=fp8,
        DOT=dot,
        PRECISION=precision,
        num_warps=num_warps,
    )
    return part_out, part_lse


def mla_decode(
    q: torch.Tensor,
    rows: torch.Tensor,
    tables: StepTables,
    lora_rank: int,
    latent_scale: float,
    rope_scale: float,
    softmax_scale: float,
    out: torch.Tensor | None = None,
    split_tokens: int | None = None,
    fp8_dot: bool | None = None,
) -> torch.Tensor:
    """Absorbed queries q [B, H, lora_rank + rope_dim] over rows [slots, latent_dim] -> [B, H, lora_rank].

    The result is in latent space and already carries the latent scale.
    Scales are 1.0 for BF16 rows; they are Python floats, passed to the
    kernel by value (a CUDA graph keeps the ones it was captured with). The
    split count comes from `tables.max_seq_len` (the longest sequence, or a
    graph's capacity), each sequence's split size from its own length;
    `split_tokens` fixes the split size instead (tests, benchmarks). Rows
    with seq_len 0 (graph padding) give zeros. No host synchronisation: the
    launch reads only Python numbers and tensor shapes, never a device value.
    `fp8_dot`: None chooses FP8 tensor-core dots where they apply, True forces
    them, False keeps the widening path (`choose_fp8_dot`, shared with GQA decode).
    """
    args = (q, rows, tables, lora_rank, latent_scale, rope_scale, softmax_scale, split_tokens)
    part_out, part_lse = mla_decode_splits(*args, fp8_dot=fp8_dot)
    if out is None:
        batch, heads, _ = q.shape
        out = torch.empty(batch, heads, lora_rank, dtype=q.dtype, device=q.device)
    merge_splits(part_out, part_lse, out)
    return out
