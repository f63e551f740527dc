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
- Q5_0, 22 bytes: d, 4 bytes of fifth bits (bit j for value j), the nibbles as
  Q4_0's; w = d * (u - 16), m = -16 d. Q5_1, 24 bytes: d, m, then the same.

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

from engine.cpu_kernels.grid_matmul import SUPER_BLOCK, pack_codes
from engine.host.memory_advice import MappedFile
from engine.weights.gguf_kquants import KQUANT_TYPES

GROUP = 32
TILE = 16
_SLICE_BYTES = 8 << 20  # of a file's rows, packed at a time
# type name -> (bytes per block, bits of the codes)
# (Q5_0 and Q5_1 codes, 0..31, are kept as 8-bit codes: the kernel has no 5-bit plain grid.
# Q4_K_M files hold them where a row is not whole K-quant super-blocks, as MLA's attn_k_b.)
BLOCK_TYPES = {
    "Q4_0": (18, 4),
    "Q4_1": (20, 4),
    "Q8_0": (34, 8),
    "Q5_0": (22, 8),
    "Q5_1": (24, 8),
}


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
    with_m = type_name in ("Q4_1", "Q5_1")
    fifth = type_name in ("Q5_0", "Q5_1")
    start = (4 if with_m else 2) + (4 if fifth else 0)
    nibbles = blocks[..., start:]
    codes = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)
    if fifth:  # 4 bytes, little-endian: bit j is code j's fifth bit
        high = blocks[..., start - 4 : start].copy().view("<u4")
        codes |= (((high >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
    if with_m:
        m = blocks[..., 2:4].copy().view(np.float16).reshape(rows, groups)
    else:
        m = (d.astype(np.float32) * (-16 if fifth else -8)).astype(np.float16)
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


@dataclass
class BlockRows:
    """Rows of quantized tensors still in the mapped file, in order: each piece is (the
    tensor's row view [rows, row bytes] uint8, the rows taken, its type name). Plain
    blocks (Q4_0, Q4_1, Q8_0, in any mix) are packed by `repack_block_rows`, K-quant
    super-blocks of one type by `repack_kquant_rows`, neither decoded first."""

    pieces: list[tuple[np.ndarray, slice | np.ndarray, str]]
    columns: int

    @property
    def rows(self) -> int:
        return sum(_count(data, taken) for data, taken, _ in self.pieces)

    @property
    def kind(self) -> str | None:
        """ "plain", the K-quant type name when every piece is of that type, or None for a
        mix that no one layout holds."""
        types = {type_name for _, _, type_name in self.pieces}
        if types <= BLOCK_TYPES.keys():
            return "plain"
        return types.pop() if len(types) == 1 and types <= KQUANT_TYPES.keys() else None

    @property
    def bits(self) -> int:
        """The packed codes' width: a K-quant type's, or 8 if any plain piece is 8-bit."""
        if self.kind in KQUANT_TYPES:
            return KQUANT_TYPES[self.kind][1].bits
        return max(BLOCK_TYPES[type_name][1] for _, _, type_name in self.pieces)


def _count(data: np.ndarray, taken: slice | np.ndarray) -> int:
    if isinstance(taken, slice):
        return len(range(*taken.indices(data.shape[0])))
    return len(taken)


_BLOCK_CODES = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q5_0": 3, "Q5_1": 4}
_KQUANT_CODES = {"Q4_K": 0, "Q5_K": 1, "Q6_K": 2}


def join_block_rows(parts: list[BlockRows]) -> BlockRows | None:
    """The parts' rows one after another, or None when their types mix a K-quant with
    another type (no one layout holds both)."""
    joined = BlockRows([piece for part in parts for piece in part.pieces], parts[0].columns)
    return joined if joined.kind is not None else None


def _pieces(rows: BlockRows, mapped: MappedFile | None):
    """Each piece as (its row view, the row index array or None, the first row, the
    count); with `mapped`, its rows' page tables populated before and their pages
    dropped after the caller packed it."""
    for data, taken, type_name in rows.pieces:
        block_bytes = (BLOCK_TYPES.get(type_name) or KQUANT_TYPES[type_name])[0]
        per_block = GROUP if type_name in BLOCK_TYPES else SUPER_BLOCK
        if data.shape[1] * per_block != rows.columns * block_bytes or data.strides[1] != 1:
            raise ValueError(f"a row of {type_name} blocks is not {rows.columns} values")
        index, first = None, 0
        if isinstance(taken, slice):
            first, stop, step = taken.indices(data.shape[0])
            if step != 1:
                taken = np.arange(first, stop, step)
        if not isinstance(taken, slice):
            index = np.ascontiguousarray(taken, dtype=np.int64)
            if len(index) and (index.min() < 0 or index.max() >= data.shape[0]):
                raise ValueError(
                    f"rows {index.min()}..{index.max()} of a {data.shape[0]}-row tensor"
                )
        count = _count(data, taken)
        if count == 0:
            continue
        if index is not None:
            yield from _mapped(data, type_name, index, first, count, mapped)
            continue
        # A long range in slices: its file pages and its packed copy are both resident
        # only a slice at a time (a 51 MiB head otherwise sat whole beside the arena).
        step = max(TILE, _SLICE_BYTES // data.strides[0] // TILE * TILE)
        for start in range(first, first + count, step):
            yield from _mapped(
                data, type_name, None, start, min(step, first + count - start), mapped
            )


def _mapped(data, type_name, index, first, count, mapped: MappedFile | None):
    """One piece, its rows' pages populated before the caller packs it, dropped after."""
    low, high = (first, first + count - 1) if index is None else (index.min(), index.max())
    if mapped is not None:
        mapped.populate(data, int(low), int(high))
    yield data, type_name, index, first, count
    if mapped is not None:  # packed: the file's pages need not stay beside the copy
        mapped.release_rows(data, int(low), int(high))


def _outputs(allocate, tiles: int, code_bytes: int, scale_bytes: int):
    """The packed weight's flat (codes, scales) buffers, `code_bytes` and `scale_bytes` a
    tile, the last tile zeroed (its padding rows are zeros, as the packers pad them)."""
    allocate = allocate or (lambda count, dtype: torch.empty(count, dtype=dtype))
    codes = allocate(tiles * code_bytes, torch.uint8)
    scales = allocate(tiles * scale_bytes, torch.uint8)
    codes[-code_bytes:].zero_()
    scales[-scale_bytes:].zero_()
    return codes, scales


def _each_piece(rows: BlockRows, mapped, codes, scales, kernel) -> tuple[int, str | None]:
    """Run a repack kernel over each piece, its rows landing after the previous piece's:
    `kernel(src, row_index, first_row, n, row_bytes, type_name=, placed=(codes, scales,
    dst_row0))` gives the C status. Returns the first nonzero status and its piece's
    type (0, None when every piece went in)."""
    written = 0
    for data, type_name, index, first, count in _pieces(rows, mapped):
        where = (data.ctypes.data, None if index is None else index.ctypes.data, first, count)
        placed = (codes.data_ptr(), scales.data_ptr(), written)
        status = kernel(*where, data.strides[0], type_name=type_name, placed=placed)
        if status != 0:
            return status, type_name
        written += count
    return 0, None


def repack_block_rows(
    rows: BlockRows, allocate=None, mapped: MappedFile | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What pack_grid_rows(decode_blocks(...)) gives, byte for byte, written by the C
    kernel (gguf_repack.c) from the file's blocks; None when a derived offset (-8 d of
    Q4_0, -128 d of Q8_0) overflows half, so the weight is not exact on the grid.

    `allocate(count, dtype)` gives the output's flat tensors (a PackedArena's `take`;
    torch.empty by default); `mapped`, the file's advice, has each piece's page tables
    populated in one call before the kernel reads it."""
    from engine.cpu_kernels.library import library

    if rows.kind != "plain":
        raise ValueError(f"repack_block_rows takes Q4_0, Q4_1 and Q8_0 rows, not {rows.kind}")
    groups, bits = rows.columns // GROUP, rows.bits
    tiles = -(-rows.rows // TILE)
    codes, scales = _outputs(allocate, tiles, TILE * groups * GROUP * bits // 8, TILE * groups * 4)

    def kernel(*where, type_name: str, placed: tuple) -> int:
        return library().gguf_grid_repack(
            *where, groups, _BLOCK_CODES[type_name], *placed, bits, torch.get_num_threads()
        )

    status, type_name = _each_piece(rows, mapped, codes, scales, kernel)
    if status == -3:
        return None
    if status != 0:
        raise ValueError(f"gguf_grid_repack refused {type_name} rows into a {bits}-bit grid")
    return codes, scales.view(torch.float16)


def repack_kquant_rows(
    rows: BlockRows, allocate=None, mapped: MappedFile | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What pack_kquant_rows(decode_kquant_blocks(...)) gives, byte for byte, written by
    the C kernel (gguf_kquant_repack.c) from the file's super-blocks of one K-quant type;
    `allocate` and `mapped` as for repack_block_rows."""
    from engine.cpu_kernels.library import library

    type_name = rows.kind
    if type_name not in KQUANT_TYPES:
        raise ValueError(f"repack_kquant_rows takes rows of one K-quant type, not {type_name}")
    fmt = KQUANT_TYPES[type_name][1]
    supers = rows.columns // SUPER_BLOCK
    tiles = -(-rows.rows // TILE)
    code_bytes, scale_bytes = fmt.tile_bytes_per_block
    codes, scales = _outputs(allocate, tiles, supers * code_bytes, supers * scale_bytes)

    def kernel(*where, type_name: str, placed: tuple) -> int:
        return library().gguf_kquant_repack(
            *where, supers, _KQUANT_CODES[type_name], *placed, torch.get_num_threads()
        )

    status, _ = _each_piece(rows, mapped, codes, scales, kernel)
    if status != 0:
        raise ValueError(f"gguf_kquant_repack refused {type_name} rows")
    return codes, scales
