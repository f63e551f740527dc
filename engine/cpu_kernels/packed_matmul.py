"""Products with weights in their checkpoint's form: INT4 group-quantized and FP8 block-scaled.

`int4_matmul` (int4_matmul.c) reads compressed-tensors' pack-quantized
words and BF16 group scales with each block of 16 rows transposed in place
(`tile_rows`: the same bytes in the order the kernel reads, done once at
load by Int4GroupMethod); `fp8_block_matmul` (fp8_block_matmul.c) reads
e4m3 bytes and the block grid of scales as Fp8BlockMethod holds them. Neither
copies the weight: memory stays the checkpoint's bytes. Both take float32
or BF16 activations [M, K] and write float32 or BF16.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library

FLOAT_DTYPES = (torch.float32, torch.bfloat16)
TILE = 16  # rows per tile of the INT4 kernel's layout


def tile_rows(t: torch.Tensor) -> torch.Tensor:
    """[N, C] -> [N, C] with each block of 16 rows transposed ([16, C] -> [C, 16]):
    what was row n's column c lands at flat position 16 c + n of its block."""
    rows, cols = t.shape
    if rows % TILE:
        raise ValueError(f"{rows} rows do not make tiles of {TILE}")
    return t.reshape(rows // TILE, TILE, cols).transpose(1, 2).contiguous().reshape(rows, cols)


def untile_rows(t: torch.Tensor) -> torch.Tensor:
    """The inverse of `tile_rows`."""
    rows, cols = t.shape
    return t.reshape(rows // TILE, cols, TILE).transpose(1, 2).contiguous().reshape(rows, cols)


def _check(x: torch.Tensor, out_dtype: torch.dtype | None, name: str) -> torch.dtype:
    if x.dtype not in FLOAT_DTYPES or not x.is_contiguous() or x.dim() != 2:
        raise ValueError(f"{name} takes a contiguous 2-D float32 or bfloat16 x")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} writes float32 or bfloat16")
    return out_dtype


def _bias(bias: torch.Tensor | None, rows: int):
    if bias is None:
        return None
    if bias.shape != (rows,):
        raise ValueError(f"bias of shape {tuple(bias.shape)} for {rows} output rows")
    return bias.float().contiguous()


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    group: int,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    int8_activations: bool = True,
) -> torch.Tensor:
    """x [M, K] times the INT4 weight [N, K]^T -> [M, N].

    packed int32 [N, K/8] (value + 8 per nibble, low nibble first) and scales
    bf16 [N, K/group], both through `tile_rows`; N a multiple of 16, group a
    multiple of 32. `int8_activations`: quantize x per 32 values to int8 for
    VNNI integer products; else multiply exact float32 weights with x in
    float32."""
    out_dtype = _check(x, out_dtype, "int4_matmul")
    rows, words = packed.shape
    cols = x.shape[1]
    if packed.dtype != torch.int32 or words * 8 != cols or not packed.is_contiguous():
        raise ValueError(f"packed must be contiguous int32 [N, {cols // 8}]")
    if group % 32 or cols % group or rows % TILE:
        raise ValueError(
            f"INT4 kernel: group {group} must be a multiple of 32 that divides {cols}, "
            f"and {rows} rows a multiple of {TILE}"
        )
    if scales.dtype != torch.bfloat16 or scales.shape != (rows, cols // group):
        raise ValueError(f"scales must be bfloat16 [{rows}, {cols // group}]")
    scales = scales.contiguous()
    bias = _bias(bias, rows)
    out = torch.empty(x.shape[0], rows, dtype=out_dtype)
    if x.shape[0] == 0 or rows == 0:
        return out
    status = library().int4_matmul(
        x.data_ptr(),
        int(x.dtype == torch.bfloat16),
        x.shape[0],
        cols,
        packed.data_ptr(),
        scales.data_ptr(),
        group,
        rows,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        int(out_dtype == torch.bfloat16),
        int(int8_activations),
        torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError("int4_matmul could not allocate its scratch buffers")
    if status != 0:
        raise ValueError(f"int4_matmul refused group {group} for {rows} x {cols}")
    return out


def _fp8_scales(
    scales: torch.Tensor, rows: int, cols: int, col_offset: int, block_cols: int, scale_rows: int
) -> tuple[torch.Tensor, int]:
    """The scales checked against the weight's shape, contiguous, and their column blocks."""
    if scale_rows < 1:
        raise ValueError(f"scale_rows must be at least 1, got {scale_rows}")
    blocks = (col_offset + cols - 1) // block_cols + 1
    expected = (-(-rows // scale_rows), blocks)
    if scales.dtype != torch.float32 or tuple(scales.shape) != expected:
        raise ValueError(
            f"scales must be float32 {list(expected)} (one row per {scale_rows} weight rows)"
        )
    return scales.contiguous(), blocks


def fp8_block_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    col_offset: int,
    block_cols: int,
    scale_rows: int,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [M, K] times the FP8 block-scaled weight [N, K]^T -> [M, N].

    weight float8_e4m3fn [N, K]; scales float32 [ceil(N / scale_rows), blocks]:
    weight row n takes scale row n // scale_rows (the checkpoint's grid with
    scale_rows = the block's rows; per-row scales with 1), which holds the
    scales of the `block_cols`-wide column blocks, column 0 at `col_offset`
    inside the first."""
    out_dtype = _check(x, out_dtype, "fp8_block_matmul")
    rows, cols = weight.shape
    if weight.dtype != torch.float8_e4m3fn or cols != x.shape[1] or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous float8_e4m3fn [N, {x.shape[1]}]")
    scales, blocks = _fp8_scales(scales, rows, cols, col_offset, block_cols, scale_rows)
    bias = _bias(bias, rows)
    out = torch.empty(x.shape[0], rows, dtype=out_dtype)
    if x.shape[0] == 0 or rows == 0:
        return out
    status = library().fp8_block_matmul(
        x.data_ptr(),
        int(x.dtype == torch.bfloat16),
        x.shape[0],
        cols,
        weight.data_ptr(),
        scales.data_ptr(),
        blocks,
        col_offset,
        block_cols,
        scale_rows,
        rows,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        int(out_dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError("fp8_block_matmul could not allocate its scratch buffers")
    if status != 0:
        raise ValueError(f"fp8_block_matmul refused blocks of {block_cols} at {col_offset}")
    return out


def fp8_block_dequantize(
    weight: torch.Tensor,
    scales: torch.Tensor,
    col_offset: int,
    block_cols: int,
    scale_rows: int,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The FP8 weight's values times their block scales (as `fp8_block_matmul` reads
    them), in float32 or bf16 (into `out` when given): Fp8BlockMethod.dequantize's
    values, computed in C."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError("fp8_block_dequantize writes float32 or bfloat16")
    rows, cols = weight.shape
    if weight.dtype != torch.float8_e4m3fn or not weight.is_contiguous():
        raise ValueError("weight must be contiguous float8_e4m3fn")
    scales, blocks = _fp8_scales(scales, rows, cols, col_offset, block_cols, scale_rows)
    if out is None:
        out = torch.empty(rows, cols, dtype=dtype)
    elif out.shape != (rows, cols) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be contiguous {dtype} [{rows}, {cols}]")
    status = library().fp8_block_dequantize(
        weight.data_ptr(),
        scales.data_ptr(),
        rows,
        cols,
        blocks,
        col_offset,
        block_cols,
        scale_rows,
        out.data_ptr(),
        int(dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError("fp8_block_dequantize could not allocate its scratch buffers")
    if status != 0:
        raise ValueError(f"fp8_block_dequantize refused blocks of {block_cols} at {col_offset}")
    return out
