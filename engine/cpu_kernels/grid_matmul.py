"""Products with 4-/8-bit grid weights and int8 activations (grid_matmul.c).

A weight `step * codes + offset` per group of 32 values along a row is kept as
its codes (two per byte for a 4-bit grid) and float32 step and offset; each row
of activations is quantized to int8 per group of 32 inside the kernel.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library

GROUP = 32
TILE = 16


def pack_codes(
    codes: torch.Tensor, step: torch.Tensor, offset: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of a weight `step * codes + offset`.

    codes [N, K/32, 32] in 0..2**bits-1, step and offset [N, K/32, 1]. Rows are
    padded with zeros to a multiple of 16 (the kernel masks them off).
    Returns (codes as uint8, scales as float16), both flat: step and offset must be
    exact in half precision (engine/layers/cpu_grid_weights.py checks).
    """
    rows, groups, _ = codes.shape
    tiles = -(-rows // TILE)
    pad = (0, 0, 0, 0, 0, tiles * TILE - rows)
    codes, step, offset = (torch.nn.functional.pad(t, pad) for t in (codes, step, offset))
    # [tile, row-in-tile, group, quad, 4] -> [tile, group, quad, row-in-tile, 4]
    by_quad = codes.to(torch.uint8).reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    if bits == 4:
        pairs = by_quad.reshape(tiles, groups, 4, 2, TILE, 4)
        by_quad = pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)
    scales = torch.stack(
        (step.reshape(tiles, TILE, groups), offset.reshape(tiles, TILE, groups)), 2
    )
    return (
        by_quad.contiguous().reshape(-1),
        scales.permute(0, 3, 2, 1).contiguous().half().reshape(-1),
    )


def grid_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    rows: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [M, K] (float32 or bf16, contiguous) times the packed weight [rows, K]^T -> [M, rows],
    in `out_dtype` (float32 or bf16; x's dtype by default)."""
    if x.dtype not in (torch.float32, torch.bfloat16) or not x.is_contiguous():
        raise ValueError("grid_matmul takes a contiguous float32 or bfloat16 x")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError("grid_matmul writes float32 or bfloat16")
    out = torch.empty(x.shape[0], rows, dtype=out_dtype)
    if x.shape[0] == 0:
        return out
    is_bf16 = int(x.dtype == torch.bfloat16)
    status = library().grid_matmul(
        x.data_ptr(),
        is_bf16,
        x.shape[0],
        x.shape[1],
        codes.data_ptr(),
        scales.data_ptr(),
        bits,
        rows,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        int(out_dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("grid_matmul could not allocate its scratch buffers")
    return out


def grid_dequantize(
    codes: torch.Tensor, scales: torch.Tensor, bits: int, rows: int, cols: int
) -> torch.Tensor:
    """The packed weight as a dense bfloat16 [rows, cols]: `step * code + offset` in
    float32, rounded to nearest even (for BF16 matrix units, AMX)."""
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    library().grid_dequantize(
        codes.data_ptr(),
        scales.data_ptr(),
        bits,
        cols,
        rows,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out
