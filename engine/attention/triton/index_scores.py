"""The lightning indexer's decode scores, read in place from the paged indexer keys.

DeepSeek sparse attention (engine/attention/sparse_mla.py) scores every
context position t of a decode query as

    score[b, t] = sum_h w[b, h] * relu(scale * q[b, h] · k[t])

in float32, then keeps the top-k. The torch path gathers a sequence's keys
into a dense [L, index_dim] tensor first; at GLM-5's 200k positions that is
a 51 MB copy per sequence and indexer layer, before a product that reads it
once. Here each program reads its positions' keys from the pool's indexer
region (engine/kv/dsa_pool.py: one row per slot, the latent's slots, so the
latent's page tables find them) and writes their scores; torch.topk then
picks from the [B, L] row. Positions at or past a sequence's length score
-inf, so the top-k takes every visible position before any of them, as the
reference's causal mask does.

The dot is computed transposed (keys as rows): positions are its M, 64 a
tile on a GPU, where Hopper's wgmma wants M a multiple of 64; the indexer's
32 or 64 heads would not give it. Keys are never FP8 (dsa_pool.py says why),
so the dot multiplies in the activations' dtype when queries and keys share
it (bf16 products are exact in the fp32 accumulator) and in IEEE fp32
otherwise, as the reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting
from engine.attention.triton.common import StepTables, block_size, paged_tile
from engine.attention.triton.target import sm_count

# Programs to aim for per SM: each reads a few tiles of keys, and the grid should
# cover the GPU many times over so that short sequences do not leave it idle.
PROGRAMS_PER_SM = 4


def tile_config() -> tuple[int, int]:
    """(BLOCK_N, num_warps): 64 positions a tile (wgmma's M) with 4 warps on a GPU;
    the interpreter takes small tiles (speed of the CPU tests)."""
    if interpreting():
        return 16, 4
    return 64, 4


def dot_dtype(queries: torch.Tensor, keys: torch.Tensor) -> tuple[tl.dtype, str]:
    """(dtype, input precision) of the score dot: the activations' half type when the keys
    are stored in it too, else fp32 in IEEE precision (the interpreter's tl.dot is wrong
    on bf16 operands: common.dot_config)."""
    if not interpreting() and queries.dtype == keys.dtype:
        if queries.dtype == torch.bfloat16:
            return tl.bfloat16, "tf32"
        if queries.dtype == torch.float16:
            return tl.float16, "tf32"
    return tl.float32, "ieee"


@triton.jit
def _index_scores_kernel(
    q_ptr,
    w_ptr,
    keys_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    scale,
    width,
    tiles_per_program,
    stride_qb,
    stride_qh,
    stride_wb,
    stride_key,
    stride_bt,
    stride_ob,
    NUM_HEADS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    span = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    h_mask = heads < NUM_HEADS
    d_mask = d < DIM
    q_rows = q_ptr + seq.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_rows, mask=h_mask[:, None] & d_mask[None, :], other=0.0).to(DOT)
    # Padded heads weigh 0 (and their zero queries score 0 before it).
    w = tl.load(w_ptr + seq.to(tl.int64) * stride_wb + heads, mask=h_mask, other=0.0)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    row = out_ptr + seq.to(tl.int64) * stride_ob
    for i in range(tiles_per_program):
        n0 = (span * tiles_per_program + i) * BLOCK_N
        offsets, n_mask, tile_mask = paged_tile(
            table, n0, seq_len, stride_key, d, d_mask, PAGE_SIZE, BLOCK_N
        )
        keys = tl.load(keys_ptr + offsets, mask=tile_mask, other=0.0).to(DOT)
        dots = tl.dot(keys, tl.trans(q), input_precision=PRECISION)  # [BLOCK_N, BLOCK_H]
        scores = tl.sum(tl.maximum(dots * scale, 0.0) * w[None, :], 1)
        pos = n0 + tl.arange(0, BLOCK_N)
        tl.store(row + pos, tl.where(n_mask, scores, float("-inf")), mask=pos < width)


def score_plan(batch: int, width: int, device: torch.device) -> tuple[int, int]:
    """(programs per sequence, tiles per program) covering `width` positions: whole tiles,
    about PROGRAMS_PER_SM programs per SM over the batch, at least one tile each."""
    block_n, _ = tile_config()
    tiles = triton.cdiv(max(width, 1), block_n)
    wanted = max(1, PROGRAMS_PER_SM * sm_count(device) // max(batch, 1))
    per_program = triton.cdiv(tiles, min(wanted, tiles))
    return triton.cdiv(tiles, per_program), per_program


def paged_index_scores(
    queries: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    tables: StepTables,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """queries [B, H, D] (one decode query a sequence, rotated), weights [B, H] float32 (the
    head weights, already times H^-0.5), keys [slots, D] (one layer's indexer region) ->
    scores [B, tables.max_seq_len] float32, -inf at positions past a sequence's length.

    The same function as sparse_mla.index_scores over the gathered keys, up to
    summation order. Reads no device tensor on the host.
    """
    batch, heads, dim = queries.shape
    if keys.shape[-1] != dim:
        raise ValueError(f"indexer queries of width {dim} over keys of {keys.shape[-1]}")
    if queries.stride(-1) != 1:
        queries = queries.contiguous()
    weights = weights.float()
    if weights.stride(-1) != 1:
        weights = weights.contiguous()
    width = tables.max_seq_len
    if out is None:
        out = torch.empty(batch, width, dtype=torch.float32, device=queries.device)
    programs, per_program = score_plan(batch, width, queries.device)
    block_n, num_warps = tile_config()
    dot, precision = dot_dtype(queries, keys)
    _index_scores_kernel[(batch, programs)](
        queries,
        weights,
        keys,
        tables.block_tables,
        tables.seq_lens,
        out,
        float(scale),
        width,
        per_program,
        queries.stride(0),
        queries.stride(1),
        weights.stride(0),
        keys.stride(0),
        tables.block_tables.stride(0),
        out.stride(0),
        NUM_HEADS=heads,
        BLOCK_H=block_size(heads),
        DIM=dim,
        BLOCK_D=block_size(dim),
        PAGE_SIZE=tables.page_size,
        BLOCK_N=block_n,
        DOT=dot,
        PRECISION=precision,
        num_warps=num_warps,
    )
    return out
