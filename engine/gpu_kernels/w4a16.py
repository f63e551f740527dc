"""W4A16 GEMM: float activations [M, K] times INT4 group-quantized weights [N, K] -> [M, N].

The weights stay as the checkpoint stores them (compressed-tensors
`pack-quantized`, engine/weights/int4_packed.py): `weight_packed` int32
[N, ceil(K/8)] with eight nibbles per word (first value lowest, value + 8)
and `weight_scale` [N, ceil(K/G)], one symmetric scale per group of G = 32
inputs. Each program computes one [BLOCK_M, BLOCK_N] output tile: per K tile
it reads the packed words of its BLOCK_N rows, unpacks and scales them in
registers (common.load_weight_tile) and multiplies on tensor cores with fp32
accumulation. So a decode step reads 4.5 bits per weight (the nibble plus a
16-bit scale per 32) instead of 16.

Tiles: decode-sized M is bound by reading weights, so small M gets
BLOCK_M = 16 (the smallest tl.dot) and narrow BLOCK_N = 64 for enough
programs to cover the GPU at N = 2048..7168; larger M gets 64 x 128 tiles
with grouped program order (GROUP_M) so consecutive programs share weight
tiles in L2. These are reasoned defaults, not yet tuned on a GPU
(docs/GPU_KERNELS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton.target import sm_count
from engine.gpu_kernels.common import (
    KIND_DENSE,
    KIND_INT4,
    dot_config,
    interpreting,
    load_act_tile,
    load_weight_tile,
)
from engine.gpu_kernels.layout import (
    FLOAT_ACTS,
    INT4,
    INT4_VALUES_PER_WORD,
    cdiv,
    check_shape,
    check_tensor,
    dense_last,
)
from engine.gpu_kernels.split_k import finish, k_per_split, k_splits, split_target

GROUP_M = 8  # programs along M that walk the same weight columns before moving on


@triton.jit
def _w4a16_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_sn,
    stride_cm,
    split_len,
    stride_cs,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Grouped ordering: GROUP_M row tiles run down one column of weight tiles
    # together, so a weight tile is read from memory once and then from L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    n_mask = n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # Split-K: this program's slice of K (whole BLOCK_K tiles); its partial sum goes to
    # slice program_id(1) of c (float32 [splits, M, N]), which the host sums in order.
    k_start = tl.program_id(1) * split_len
    k_end = tl.minimum(k_start + split_len, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K  # the tail tile: masked activations are 0, so padding nibbles add nothing
        a, _ = load_act_tile(a_ptr, a_ptr, rows, k, k0, row_mask, k_mask, stride_am, 0,
                             KIND_DENSE, 1, DOT)  # fmt: skip
        w, _ = load_weight_tile(w_ptr, s_ptr, n, k, k0, n_mask, k_mask, stride_wn, stride_sn, 1,
                                KIND_INT4, 1, GROUP, DOT)  # fmt: skip
        acc += tl.dot(a, w, input_precision=PRECISION)
    c_ptrs = c_ptr + tl.program_id(1) * stride_cs + rows[:, None] * stride_cm + n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])


def tiles(m: int) -> dict:
    """BLOCK_M/N/K, warps and pipeline stages for M rows (the interpreter: smallest tiles).

    8 warps: unpacking a weight tile with its group scales in registers needs
    more than 4 warps have. With 4, sm_90 spilled 252 B/thread (Triton 3.9)
    at the decode tiles and 608 B (Triton 3.6) at 64 x 128; with 8, none
    (`python -m engine.devtools.kernel_check` measures it; docs/BENCHMARKS.md).
    """
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=1, num_stages=1)
    if m <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=4)
    if m <= 64:
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=4)
    return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)


def w4a16_gemm(
    x: torch.Tensor,
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    group_size: int = 32,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32) @ dequantized(weight).T -> [M, N] in out_dtype (default x's).

    weight_packed: int32 [N, ceil(K/8)]; weight_scale: float [N, ceil(K/group_size)].
    Equals `x @ dequantize_packed_int4(...).T` up to fp32 summation order and the
    output's rounding (on a GPU also the weights' rounding to x's dtype).
    `splits` fixes the split-K count (tests); else `split_k.k_splits` plans it.
    """
    check_tensor("x", x, 2, FLOAT_ACTS, x.device)
    check_tensor("weight_packed", weight_packed, 2, (torch.int32,), x.device)
    check_tensor("weight_scale", weight_scale, 2, FLOAT_ACTS, x.device)
    if group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    m, k = x.shape
    n = weight_packed.shape[0]
    check_shape("weight_packed", weight_packed, (n, cdiv(k, INT4_VALUES_PER_WORD)),
                f"eight int4 values per int32 along K = {k}")  # fmt: skip
    check_shape("weight_scale", weight_scale, (n, cdiv(k, group_size)),
                f"one scale per {group_size} of K = {k}")  # fmt: skip
    out_dtype = out_dtype or x.dtype
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    else:
        check_tensor("out", out, 2, FLOAT_ACTS, x.device)
        check_shape("out", out, (m, n), "x rows by weight rows")
        if out.stride(-1) != 1:
            raise ValueError("out must have a unit stride along its last dimension")
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    x, weight_packed, weight_scale = (
        dense_last(x),
        dense_last(weight_packed),
        dense_last(weight_scale),
    )
    cfg = tiles(m)
    dot, precision = dot_config(x.dtype, INT4, x.device)
    if splits is None:
        splits = k_splits(m, n, k, cfg, sm_count(x.device))
    target, stride_row, stride_split = split_target(splits, out)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), splits)
    _w4a16_kernel[grid](
        x,
        weight_packed,
        weight_scale,
        target,
        m,
        n,
        k,
        x.stride(0),
        weight_packed.stride(0),
        weight_scale.stride(0),
        stride_row,
        k_per_split(k, cfg["BLOCK_K"], splits),
        stride_split,
        GROUP=group_size,
        GROUP_M=GROUP_M,
        DOT=dot,
        PRECISION=precision,
        **cfg,
    )
    finish(target, out)
    return out
