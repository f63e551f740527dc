"""Products with grid weights and int8 activations (grid_matmul.c).

A weight `step * codes + offset` per group of 32 values along a row is kept as
its codes (two per byte for a 4-bit grid) and its scales in one of the layouts
of grid_formats.h; each row of activations is quantized to int8 per group of 32
inside the kernel. `pack_codes` makes the plain grids' layout, kquant_pack.py
the K-quants'.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum

import torch

from engine.cpu_kernels.library import library

GROUP = 32
TILE = 16
# Values of a K-quant row that share a d (and dmin): a super-block.
SUPER_BLOCK = 256


class GridFormat(IntEnum):
    """A grid weight's layout, as grid_formats.h numbers them: plain grids (w = d * u + m
    per group of 32, d and m half) by their code width, llama.cpp's K-quants by ggml's
    type numbers."""

    U4 = 4
    U8 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14

    @property
    def bits(self) -> int:
        """The codes' width (a plain grid's is its number): what a weight's codes take,
        bytes of scales aside."""
        return {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6}.get(self.name, int(self))

    @property
    def block(self) -> int:
        """Values along a row that share scales: a row is whole blocks."""
        return GROUP if self in (GridFormat.U4, GridFormat.U8) else SUPER_BLOCK

    @property
    def tile_bytes_per_block(self) -> tuple[int, int]:
        """A tile's bytes of (codes, scales) per block of `block` values (grid_formats.h
        group_bytes times the block's groups, and block_scale_bytes)."""
        return _TILE_BYTES_PER_BLOCK[self.name]


# codes: a group's 16 rows x 32 values (nibbles and planes) times the groups of a block;
# scales: 16 d and 16 m (plain), 16 d, 16 dmin and 8 x 32 factor bytes (Q4_K, Q5_K), or 16 d
# and 8 x 32 (Q6_K)
_TILE_BYTES_PER_BLOCK = {
    "U4": (256, 64),
    "U8": (512, 64),
    "Q4_K": (8 * 256, 64 + 8 * 32),
    "Q5_K": (8 * 320, 64 + 8 * 32),
    "Q6_K": (8 * 384, 32 + 8 * 32),
}


class GridWeightRef(ctypes.Structure):
    """kernels.h's GridWeightRef: one grid weight as the composing kernels take it."""

    _fields_ = [
        ("codes", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("rows", ctypes.c_int64),
        ("format", ctypes.c_int64),
    ]

    @classmethod
    def of(cls, packed) -> GridWeightRef:
        """From a GridWeight (engine/layers/cpu_grid_weights.py): pointers into its tensors,
        which must outlive the reference."""
        bias = packed.bias.data_ptr() if packed.bias is not None else None
        return cls(
            packed.codes.data_ptr(), packed.scales.data_ptr(), bias, packed.rows, int(packed.format)
        )


def pad_rows(tensor: torch.Tensor) -> torch.Tensor:
    """tensor [N, ...] with zero rows added up to whole tiles of 16 (the kernel masks them off)."""
    missing = -tensor.shape[0] % TILE
    return torch.cat((tensor, tensor.new_zeros(missing, *tensor.shape[1:]))) if missing else tensor


def code_vectors(codes: torch.Tensor) -> torch.Tensor:
    """codes [N, K/32, 32] (N whole tiles) as the kernel's vectors [tiles, K/32, 8, 64] uint8:
    vector j of a tile and group holds, in lane n, the codes of k = 4j..4j+3 of row n."""
    rows, groups, _ = codes.shape
    # [tile, row-in-tile, group, quad, 4] -> [tile, group, quad, row-in-tile, 4]
    by_quad = codes.to(torch.uint8).reshape(rows // TILE, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    return by_quad.reshape(rows // TILE, groups, 8, TILE * 4)


def nibble_vectors(vectors: torch.Tensor) -> torch.Tensor:
    """code_vectors' low 4 bits, vectors 2i and 2i + 1 in the low and high nibbles of one:
    [tiles, K/32, 4, 64]."""
    low = vectors & 0x0F
    return low[:, :, 0::2] | (low[:, :, 1::2] << 4)


def pack_codes(
    codes: torch.Tensor, step: torch.Tensor, offset: torch.Tensor, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of a plain grid weight `step * codes + offset` (GridFormat U4, U8).

    codes [N, K/32, 32] in 0..2**bits-1, step and offset [N, K/32, 1]. Rows are
    padded with zeros to a multiple of 16 (the kernel masks them off).
    Returns (codes as uint8, scales as float16), both flat: step and offset must be
    exact in half precision (engine/layers/cpu_grid_weights.py checks).
    """
    codes, step, offset = (pad_rows(t) for t in (codes, step, offset))
    tiles, groups = codes.shape[0] // TILE, codes.shape[1]
    vectors = code_vectors(codes)
    if bits == 4:
        vectors = nibble_vectors(vectors)
    scales = torch.stack(
        (step.reshape(tiles, TILE, groups), offset.reshape(tiles, TILE, groups)), 2
    )
    return (
        vectors.contiguous().reshape(-1),
        scales.permute(0, 3, 2, 1).contiguous().half().reshape(-1),
    )


def _check(status: int, name: str) -> None:
    if status == -1:
        raise MemoryError(f"{name} could not allocate its scratch buffers")
    if status == -2:
        raise ValueError(f"{name}: a row is not whole blocks of the weight's format")


def grid_matmul(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    fmt: int,
    rows: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [M, K] (float32 or bf16, contiguous) times the packed weight [rows, K]^T -> [M, rows],
    in `out_dtype` (float32 or bf16; x's dtype by default); `fmt` a GridFormat."""
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
        int(fmt),
        rows,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        int(out_dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    _check(status, "grid_matmul")
    return out


def grid_dequantize(
    codes: torch.Tensor, scales: torch.Tensor, fmt: int, rows: int, cols: int
) -> torch.Tensor:
    """The packed weight as a dense bfloat16 [rows, cols]: each value the float32 the
    checkpoint's dequantizer computes, rounded to nearest even (for BF16 matrix units,
    AMX)."""
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    status = library().grid_dequantize(
        codes.data_ptr(),
        scales.data_ptr(),
        int(fmt),
        cols,
        rows,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    _check(status, "grid_dequantize")
    return out


def grid_gather_rows(
    codes: torch.Tensor,
    scales: torch.Tensor,
    fmt: int,
    rows: int,
    cols: int,
    ids: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Rows `ids` (any shape) of the packed weight [rows, cols] -> [*ids.shape, cols] in
    float32 or bfloat16: each value the float32 the checkpoint's dequantizer computes
    (then rounded to nearest even for bfloat16), as an embedding lookup gives from the
    dequantized table."""
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError("grid_gather_rows writes float32 or bfloat16")
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(flat.numel(), cols, dtype=out_dtype)
    status = library().grid_gather_rows(
        codes.data_ptr(),
        scales.data_ptr(),
        int(fmt),
        cols,
        rows,
        flat.data_ptr(),
        flat.numel(),
        out.data_ptr(),
        int(out_dtype == torch.bfloat16),
        torch.get_num_threads(),
    )
    if status == -3:
        raise IndexError(f"an id outside 0..{rows - 1} was looked up")
    _check(status, "grid_gather_rows")
    return out.reshape(*ids.shape, cols)
