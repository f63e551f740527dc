"""llama.cpp's Q4_0, Q4_1 and Q8_0 blocks read straight into the CPU grid kernel's form.

A block holds 32 consecutive values of a row as unsigned codes with a step
and an offset in IEEE half, exactly what the int8-activation kernel
multiplies (engine/cpu_kernels/grid_matmul.c: w = d * u + m):

- Q4_0, 18 bytes: d, then 16 bytes of nibbles (value j in the low nibble of
  byte j, value j + 16 in the high one); w = d * (u - 8), so m = -8 d, which
  half holds exactly (a power-of-two multiple) unless it overflows.
- Q4_1, 20 bytes: d, m, the same nibbles; w = d * u + m.
- Q8_0, 34 bytes: d, then 32 signed bytes q; w = d * q, so u = q + 128 and
  m = -128 d.

Nothing goes through float32: a tensor's bytes become codes and half scales,
and the values the kernel sees are exactly the ones gguf's own dequantizer
computes (tests/engine/test_gguf_blocks.py; only the sign of a zero can
differ). A layer whose rows come from several tensors (a fused q/k/v, an expert's gate and up) takes
each part's rows in order; a 4-bit part beside an 8-bit one keeps its codes
and scales as 8-bit codes (u < 16 is still u), so mixed files stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.cpu_kernels.grid_matmul import pack_codes

GROUP = 32
# type name -> (bytes per block, bits of the codes)
BLOCK_TYPES = {"Q4_0": (18, 4), "Q4_1": (20, 4), "Q8_0": (34, 8)}


@dataclass
class GridRows:
    """Rows of a grid weight: codes [rows, K/32, 32] uint8, d and m [rows, K/32] float16."""

    codes: np.ndarray
    d: np.ndarray
    m: np.ndarray
    bits: int

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    def values(self) -> np.ndarray:
        """The float32 values, computed as gguf's dequantizer does (d * u + m)."""
        d, m = self.d.astype(np.float32)[..., None], self.m.astype(np.float32)[..., None]
        return (d * self.codes.astype(np.float32) + m).reshape(self.rows, -1)


def decode_blocks(data: np.ndarray, type_name: str, columns: int) -> GridRows:
    """A quantized tensor's bytes ([rows, row bytes] uint8, as gguf's reader maps them)."""
    if type_name not in BLOCK_TYPES:
        raise ValueError(f"{type_name} blocks are not read as a grid; known: {list(BLOCK_TYPES)}")
    block_bytes, bits = BLOCK_TYPES[type_name]
    if columns % GROUP:
        raise ValueError(f"a row of {columns} values is not whole {type_name} blocks")
    groups = columns // GROUP
    blocks = np.ascontiguousarray(data).reshape(-1, groups, block_bytes)
    rows = blocks.shape[0]
    d = blocks[..., 0:2].copy().view(np.float16).reshape(rows, groups)
    if type_name == "Q8_0":
        q = blocks[..., 2:].view(np.int8)
        codes = (q.astype(np.int16) + 128).astype(np.uint8)
        m = (d.astype(np.float32) * -128).astype(np.float16)
        return GridRows(codes, d, m, bits)
    start = 4 if type_name == "Q4_1" else 2
    nibbles = blocks[..., start:]
    codes = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)
    if type_name == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16).reshape(rows, groups)
    else:
        m = (d.astype(np.float32) * -8).astype(np.float16)
    return GridRows(codes, d, m, bits)


def offsets_exact(rows: GridRows) -> bool:
    """Whether the derived offsets (-8 d, -128 d) stayed finite in half (they are exact
    whenever finite: a power-of-two multiple of a half)."""
    return bool(np.isfinite(rows.m).all())


def join_rows(parts: list[GridRows]) -> GridRows:
    """The parts' rows one after another; all 8-bit if any part is."""
    bits = max(part.bits for part in parts)
    return GridRows(
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.d for p in parts]),
        np.concatenate([p.m for p in parts]),
        bits,
    )


def pack_grid_rows(rows: GridRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) in the int8 kernel's tile layout (engine/cpu_kernels/grid_matmul.py)."""
    codes = torch.from_numpy(rows.codes)
    d = torch.from_numpy(rows.d).unsqueeze(-1)
    m = torch.from_numpy(rows.m).unsqueeze(-1)
    return pack_codes(codes, d, m, rows.bits)
