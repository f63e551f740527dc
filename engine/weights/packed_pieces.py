"""A packed checkpoint weight as the loader hands it to a layer: FP8 block-scaled or
INT4 group-quantized, kept in the checkpoint's form and cut by rows or columns
(tensor-parallel shards, fused projections) without dequantizing.

The checkpoint readers (engine/weights/fp8_block_format.py, int4_packed.py)
make them; the packed linear methods (engine/layers/packed_methods.py) keep them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Fp8Piece:
    """Rows and columns of an FP8 block-scaled weight, with the part of the checkpoint's
    block grid of scales they cross."""

    values: torch.Tensor  # float8_e4m3fn [rows, cols]
    scales: torch.Tensor  # float32 [row blocks crossed, column blocks crossed]
    row_offset: int  # position of row 0 inside its block of rows
    col_offset: int  # position of column 0 inside its block of columns
    block: tuple[int, int]  # (rows, cols) of a block

    @staticmethod
    def from_checkpoint(weight: torch.Tensor, scale_inv: torch.Tensor, block) -> Fp8Piece:
        return Fp8Piece(weight, scale_inv.float(), 0, 0, (int(block[0]), int(block[1])))

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def row_scales(self) -> torch.Tensor:
        """float32 [rows, column blocks crossed]: each row's block scales."""
        rows = self.values.shape[0]
        expanded = self.scales.repeat_interleave(self.block[0], dim=0)
        return expanded[self.row_offset : self.row_offset + rows].contiguous()

    def narrow(self, dim: int, start: int, length: int) -> Fp8Piece:
        offset = self.row_offset if dim == 0 else self.col_offset
        size = self.block[dim]
        first = (offset + start) // size
        last = (offset + start + length - 1) // size
        values = self.values.narrow(dim, start, length)
        scales = self.scales[first : last + 1] if dim == 0 else self.scales[:, first : last + 1]
        offsets = [self.row_offset, self.col_offset]
        offsets[dim] = (offset + start) % size
        return Fp8Piece(values, scales, *offsets, self.block)


@dataclass
class Int4Piece:
    """Rows and whole groups of columns of an INT4 pack-quantized weight."""

    packed: torch.Tensor  # int32 [rows, cols / 8]
    scales: torch.Tensor  # bf16 [rows, cols / group]
    cols: int
    group: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.packed.shape[0], self.cols))

    def narrow(self, dim: int, start: int, length: int) -> Int4Piece:
        if dim == 0:
            return Int4Piece(
                self.packed.narrow(0, start, length),
                self.scales.narrow(0, start, length),
                self.cols,
                self.group,
            )
        if start % self.group or length % self.group:
            raise ValueError(
                f"columns {start}..{start + length} do not fall on INT4 groups of {self.group}"
            )
        return Int4Piece(
            self.packed[:, start // 8 : (start + length) // 8],
            self.scales[:, start // self.group : (start + length) // self.group],
            length,
            self.group,
        )


PackedPiece = Fp8Piece | Int4Piece
