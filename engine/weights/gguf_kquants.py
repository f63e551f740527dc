"""llama.cpp's K-quant blocks (Q4_K, Q5_K, Q6_K) read straight into the CPU grid kernel's form.

The types Q4_K_M and Q5_K_M files are made of. A block is a super-block of 256
consecutive values of a row:

- Q4_K, 144 bytes: d and dmin (half), 12 bytes packing eight 6-bit scales sc and
  eight 6-bit mins mn, 128 bytes of nibbles (32 bytes per pair of sub-blocks:
  sub-block 2i in the low nibbles, 2i + 1 in the high ones). Sub-block j, 32
  values: w = d * sc_j * u - dmin * mn_j.
- Q5_K, 176 bytes: the same and 32 bytes of fifth bits (bit j of byte i: value i
  of sub-block j) before the nibbles; u in 0..31.
- Q6_K, 210 bytes: 128 bytes of low nibbles, 64 of bits 4-5, 16 int8 scales (one
  per 16 values), d; w = d * sc * (u - 32), u in 0..63.

The kernel (engine/cpu_kernels/grid_formats.h) keeps d, dmin, sc and mn as they
are and multiplies them in float32, where d * sc and dmin * mn are exact, so it
multiplies the values gguf's dequantizer computes: `values()` computes them the
same way, and tests/engine/test_gguf_kquants.py checks both against gguf.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.cpu_kernels.grid_matmul import SUPER_BLOCK, GridFormat
from engine.cpu_kernels.kquant_pack import pack_kquant

GROUP = 32
# type name -> (bytes per block, the kernel's format)
KQUANT_TYPES = {
    "Q4_K": (144, GridFormat.Q4_K),
    "Q5_K": (176, GridFormat.Q5_K),
    "Q6_K": (210, GridFormat.Q6_K),
}


@dataclass
class KQuantRows:
    """Rows of a K-quant weight, S = K / 256 super-blocks a row: codes [rows, K/32, 32]
    uint8, d [rows, S] float16, scales [rows, S, 8] uint8 (Q4_K, Q5_K) or [rows, S, 16]
    int8 (Q6_K); dmin [rows, S] float16 and mins [rows, S, 8] uint8 (Q4_K, Q5_K)."""

    format: GridFormat
    codes: np.ndarray
    d: np.ndarray
    scales: np.ndarray
    dmin: np.ndarray | None = None
    mins: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return self.codes.shape[0]

    def values(self) -> np.ndarray:
        """The float32 values, computed as gguf's dequantizer does: the factors'
        products first (exact), then one rounding."""
        rows, supers = self.d.shape
        codes = self.codes.reshape(rows, supers, self.scales.shape[-1], -1)
        step = self.d.astype(np.float32)[..., None] * self.scales.astype(np.float32)
        if self.format == GridFormat.Q6_K:
            values = step[..., None] * (codes.astype(np.int8) - np.int8(32)).astype(np.float32)
        else:
            offset = self.dmin.astype(np.float32)[..., None] * self.mins.astype(np.float32)
            values = step[..., None] * codes.astype(np.float32) - offset[..., None]
        return values.reshape(rows, -1)


def _halves(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[..., start : start + 2].copy().view(np.float16)[..., 0]


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins. Bytes 0-3
    hold scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; scales and mins 4-7 keep
    their low 4 bits in bytes 8-11 (low and high nibble) and their top 2 bits in the top
    bits of bytes 0-3 and 4-7."""
    low, mid, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate((low & 0x3F, (top & 0x0F) | ((low >> 6) << 4)), axis=-1)
    mins = np.concatenate((mid & 0x3F, (top >> 4) | ((mid >> 6) << 4)), axis=-1)
    return scales, mins


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes of nibbles [.., 128] -> 256 codes [.., 8, 32] by sub-block."""
    pairs = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return np.concatenate((pairs & 0x0F, pairs >> 4), axis=-2).reshape(*qs.shape[:-1], 8, 32)


def _q6_codes(blocks: np.ndarray) -> np.ndarray:
    """Q6_K's 6-bit codes [.., 8, 32] (32-value chunks in order). Each half of 128 values
    has 64 bytes of nibbles (chunks 0 and 1 low, 2 and 3 high) and 32 bytes of bits 4-5
    (chunk c at bits 2c)."""
    low = blocks[..., 0:128].reshape(*blocks.shape[:-1], 2, 1, 2, 32)
    low = np.concatenate((low & 0x0F, low >> 4), axis=-3).reshape(*blocks.shape[:-1], 2, 4, 32)
    high = blocks[..., 128:192].reshape(*blocks.shape[:-1], 2, 1, 32)
    high = (high >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 0x03
    return (low | (high << 4)).reshape(*blocks.shape[:-1], 8, 32)


def decode_kquant_blocks(data: np.ndarray, type_name: str, columns: int) -> KQuantRows:
    """A K-quant tensor's bytes ([rows, row bytes] uint8, as gguf's reader maps them)."""
    if type_name not in KQUANT_TYPES:
        raise ValueError(f"{type_name} is not a K-quant type; known: {list(KQUANT_TYPES)}")
    block_bytes, fmt = KQUANT_TYPES[type_name]
    if columns % SUPER_BLOCK:
        raise ValueError(f"a row of {columns} values is not whole {type_name} blocks")
    supers = columns // SUPER_BLOCK
    blocks = np.ascontiguousarray(data).reshape(-1, supers, block_bytes)
    rows = blocks.shape[0]
    if fmt == GridFormat.Q6_K:
        codes = _q6_codes(blocks)
        scales = blocks[..., 192:208].view(np.int8)
        return KQuantRows(fmt, codes.reshape(rows, -1, GROUP), _halves(blocks, 208), scales)
    scales, mins = _scales_and_mins(blocks[..., 4:16])
    if fmt == GridFormat.Q5_K:
        fifth = blocks[..., 16:48][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]
        codes = _nibbles(blocks[..., 48:176]) | ((fifth & 0x01) << 4)
    else:
        codes = _nibbles(blocks[..., 16:144])
    return KQuantRows(
        fmt, codes.reshape(rows, -1, GROUP), _halves(blocks, 0), scales, _halves(blocks, 2), mins
    )


def join_kquant_rows(parts: list) -> KQuantRows | None:
    """The parts' rows one after another, or None unless all are K-quant rows of one
    format (a fused layer mixing Q4_K and Q6_K parts stays dense: neither format holds
    the other's values)."""
    if not all(isinstance(p, KQuantRows) for p in parts) or len({p.format for p in parts}) != 1:
        return None

    def joined(name: str):
        arrays = [getattr(p, name) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays)

    fields = ("codes", "d", "scales", "dmin", "mins")
    return KQuantRows(parts[0].format, *(joined(name) for name in fields))


def pack_kquant_rows(rows: KQuantRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) in the kernel's layout for the rows' format
    (engine/cpu_kernels/kquant_pack.py)."""

    def tensor(array):
        return None if array is None else torch.from_numpy(np.ascontiguousarray(array))

    fields = (rows.codes, rows.d, rows.scales, rows.dmin, rows.mins)
    return pack_kquant(rows.format, *(tensor(array) for array in fields))
