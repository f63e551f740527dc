"""FP8 block-scaled GEMM: e4m3 activations x e4m3 weights with 128x128 block scales -> BF16.

DeepSeek V3 / Kimi K2 FP8 checkpoints (engine/weights/fp8_block_format.py) store a
linear layer as `weight` float8_e4m3fn [N, K] and `weight_scale_inv` float32
[ceil(N/128), ceil(K/128)]: the weight is `weight * scale_inv[n//128, k//128]`.
Activations are quantized per token in groups of 128 along K
(fp8_act_quant.py), so one K tile of 128 lies in one activation group and one
weight block column, and the product over that tile needs one factor per
(row, column): `acc += dot(a_q, w_q) * a_scale[m] * w_scale[n // 128]`.
Nothing is dequantized to memory; the dot runs on FP8 tensor cores (compute
capability 8.9+) or in bf16 (exact for e4m3 inputs) on older GPUs.

Edges: K and N need not be multiples of 128 (or of the tiles). Out-of-range
columns load as zero bytes (+0.0 in e4m3) and out-of-range scales as zero, so
the tail tiles add nothing; the store is masked. Weight scales are loaded
per output column (n // 128), so BLOCK_N need not divide 128.

Tiles: BLOCK_K = 128 (one scale group per tile; the K loop has ceil(K/128)
steps). Decode-sized M: 16 x 64 tiles (weight-bandwidth bound, N/64 programs
fill an H200 for N >= 8448); larger M: 64 x 128 with grouped ordering for L2
reuse. Reasoned defaults, not yet tuned on a GPU (docs/GPU_KERNELS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton.target import sm_count
from engine.gpu_kernels.common import (
    KIND_FP8,
    dot_config,
    interpreting,
    load_act_tile,
    load_weight_tile,
)
from engine.gpu_kernels.fp8_act_quant import quantize_activations
from engine.gpu_kernels.layout import (
    FLOAT_ACTS,
    FP8,
    FP8_BLOCK,
    as_bytes,
    cdiv,
    check_shape,
    check_tensor,
    dense_last,
)
from engine.gpu_kernels.split_k import finish, k_per_split, k_splits, split_target
from engine.kv.quant import FP8_DTYPE

GROUP_M = 8


@triton.jit
def _fp8_block_kernel(
    a_ptr,
    as_ptr,
    w_ptr,
    ws_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_asm,
    stride_wn,
    stride_wsn,
    stride_wsk,
    stride_cm,
    split_len,
    stride_cs,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT: tl.constexpr,
):
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
    # Split-K (split_k.py): this program's whole-tile slice of K; its partial product
    # goes to slice program_id(1) of c.
    k_start = tl.program_id(1) * split_len
    for k0 in range(k_start, tl.minimum(k_start + split_len, K), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        a, a_scale = load_act_tile(a_ptr, as_ptr, rows, k, k0, row_mask, k_mask, stride_am,
                                   stride_asm, KIND_FP8, SCALE_K, DOT)  # fmt: skip
        w, w_scale = load_weight_tile(w_ptr, ws_ptr, n, k, k0, n_mask, k_mask, stride_wn,
                                      stride_wsn, stride_wsk, KIND_FP8, SCALE_N, SCALE_K, DOT)  # fmt: skip
        acc += tl.dot(a, w) * (a_scale[:, None] * w_scale[None, :])
    c_ptrs = c_ptr + tl.program_id(1) * stride_cs + rows[:, None] * stride_cm + n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])


def tiles(m: int) -> dict:
    """BLOCK_M/N, warps and stages for M rows (BLOCK_K is the scale block, 128)."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=32, num_warps=1, num_stages=1)
    if m <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=4)
    if m <= 64:
        return dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4)
    return dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3)


def fp8_block_gemm(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK),
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    splits: int | None = None,
) -> torch.Tensor:
    """Quantized activations x_q [M, K] (e4m3) with x_scale [M, ceil(K/block_k)] times
    weight [N, K] (e4m3) with weight_scale_inv [ceil(N/block_n), ceil(K/block_k)] -> [M, N].

    The activation group must equal the weight block along K (block[1]).
    `splits` fixes the split-K count (tests); else `split_k.k_splits` plans it.
    """
    check_tensor("x_q", x_q, 2, (FP8_DTYPE,), x_q.device)
    check_tensor("x_scale", x_scale, 2, (torch.float32,), x_q.device)
    check_tensor("weight", weight, 2, (FP8_DTYPE,), x_q.device)
    check_tensor("weight_scale_inv", weight_scale_inv, 2, (torch.float32,), x_q.device)
    block_n, block_k = block
    if block_k < 16 or block_k & (block_k - 1) or block_n <= 0:
        raise ValueError(f"block must be (positive, power of two >= 16), got {block}")
    m, k = x_q.shape
    n = weight.shape[0]
    check_shape("weight", weight, (n, k), f"N rows of K = {k} inputs, as x_q has")
    check_shape("x_scale", x_scale, (m, cdiv(k, block_k)), f"one scale per {block_k} of K")
    check_shape("weight_scale_inv", weight_scale_inv, (cdiv(n, block_n), cdiv(k, block_k)),
                f"one scale per {block_n}x{block_k} block")  # fmt: skip
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=x_q.device)
    else:
        check_tensor("out", out, 2, FLOAT_ACTS, x_q.device)
        check_shape("out", out, (m, n), "x rows by weight rows")
        if out.stride(-1) != 1:
            raise ValueError("out must have a unit stride along its last dimension")
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    a, w = as_bytes(x_q), as_bytes(weight)
    x_scale, weight_scale_inv = dense_last(x_scale), weight_scale_inv.contiguous()
    cfg = tiles(m)
    dot, _ = dot_config(torch.bfloat16, FP8, x_q.device)
    if splits is None:
        splits = k_splits(m, n, k, {**cfg, "BLOCK_K": block_k}, sm_count(x_q.device))
    target, stride_row, stride_split = split_target(splits, out)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), splits)
    _fp8_block_kernel[grid](
        a,
        x_scale,
        w,
        weight_scale_inv,
        target,
        m,
        n,
        k,
        a.stride(0),
        x_scale.stride(0),
        w.stride(0),
        weight_scale_inv.stride(0),
        weight_scale_inv.stride(1),
        stride_row,
        k_per_split(k, block_k, splits),
        stride_split,
        SCALE_N=block_n,
        SCALE_K=block_k,
        BLOCK_K=block_k,
        GROUP_M=GROUP_M,
        DOT=dot,
        **cfg,
    )
    finish(target, out)
    return out


def fp8_block_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK),
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [..., K] float -> quantize per token and group of block[1] -> GEMM -> [..., N] (x's dtype)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor [..., K]")
    flat = x.reshape(-1, x.shape[-1])
    check_tensor("x", flat, 2, FLOAT_ACTS, x.device)
    x_q, x_scale = quantize_activations(flat, block[1])
    out = fp8_block_gemm(x_q, x_scale, weight, weight_scale_inv, block, out_dtype or x.dtype)
    return out.view(*x.shape[:-1], weight.shape[0])
