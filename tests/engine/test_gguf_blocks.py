"""GGUF Q4_0/Q4_1/Q8_0/Q5_0/Q5_1 blocks read into grid codes: exactly the values gguf dequantizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from engine.cpu_kernels.grid_matmul import grid_gather_rows
from engine.cpu_kernels.library import unavailable
from engine.layers.cpu_grid_weights import GridWeight
from engine.weights import gguf_blocks
from engine.weights.gguf_blocks import (
    BLOCK_TYPES,
    decode_blocks,
    join_rows,
    offsets_exact,
    pack_grid_rows,
)

ROWS, COLS = 40, 96


def _file_bytes(type_name: str, seed: int, rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    """(the tensor's bytes as gguf's reader maps them [rows, row bytes], its values)."""
    weight = torch.randn(rows, COLS, generator=torch.Generator().manual_seed(seed)).numpy()
    kind = GGMLQuantizationType[type_name]
    data = quants.quantize(weight * 0.05, kind)
    return data, quants.dequantize(data, kind)


@pytest.mark.parametrize("type_name", list(BLOCK_TYPES))
def test_blocks_decode_to_exactly_the_values_gguf_dequantizes(type_name):
    data, expected = _file_bytes(type_name, seed=1)
    rows = decode_blocks(data, type_name, COLS)
    assert rows.codes.dtype == np.uint8 and rows.d.dtype == rows.m.dtype == np.float16
    assert rows.codes.max() < 2**rows.bits
    # Equal as numbers (Q4_0's d * (u - 8) is -0.0 where d * u + m is +0.0 for negative d).
    assert np.array_equal(rows.values(), expected.astype(np.float32))


def _kernel_columns(packed: GridWeight, columns: int) -> torch.Tensor:
    """The weight as the kernel multiplies it: one-hot rows quantize exactly (127 * 1/127),
    a few at a time (an AMX machine takes BF16 tiles from 64 rows on)."""
    identity = torch.eye(columns)
    return torch.cat([packed.matmul(rows, torch.float32) for rows in identity.split(8)]).T


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
@pytest.mark.parametrize("type_name", list(BLOCK_TYPES))
def test_the_kernel_multiplies_the_files_values(type_name):
    data, expected = _file_bytes(type_name, seed=2)
    rows = decode_blocks(data, type_name, COLS)
    codes, scales = pack_grid_rows(rows)
    packed = GridWeight(codes, scales, rows.bits, rows.rows, f"{rows.bits}-bit")
    got = _kernel_columns(packed, COLS)
    assert torch.allclose(got, torch.from_numpy(expected), rtol=0, atol=2.0**-20)
    ids = torch.tensor([ROWS - 1, 0, 21, 21])  # rows looked up as an embedding
    for dtype in (torch.float32, torch.bfloat16):
        rows_got = grid_gather_rows(codes, scales, packed.format, ROWS, COLS, ids, dtype)
        assert torch.equal(rows_got, torch.from_numpy(expected).to(dtype)[ids])


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
def test_a_layer_joined_from_4_and_8_bit_parts_stays_exact():
    """A fused layer whose parts a Q4_K_M-style file stores in different types."""
    types = ["Q4_1", "Q8_0", "Q4_0"]
    parts = [
        _file_bytes(t, seed, rows)
        for t, seed, rows in zip(types, (3, 4, 5), (24, 8, 16), strict=True)
    ]
    decoded = [decode_blocks(data, t, COLS) for (data, _), t in zip(parts, types, strict=True)]
    joined = join_rows(decoded)
    assert joined.bits == 8 and joined.rows == 48
    codes, scales = pack_grid_rows(joined)
    packed = GridWeight(codes, scales, 8, joined.rows, "8-bit")
    expected = np.concatenate([values for _, values in parts])
    got = _kernel_columns(packed, COLS)
    assert torch.allclose(got, torch.from_numpy(expected), rtol=0, atol=2.0**-20)


def test_a_row_of_partial_blocks_is_refused():
    data, _ = _file_bytes("Q8_0", 6)
    with pytest.raises(ValueError, match="whole Q8_0 blocks"):
        decode_blocks(data, "Q8_0", COLS - 16)
    with pytest.raises(ValueError, match="Q6_K blocks are not read"):
        decode_blocks(data, "Q6_K", COLS)


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
@pytest.mark.parametrize(
    "pieces",
    [
        [("Q4_1", slice(0, 40))],
        [("Q4_0", slice(3, 37))],
        [("Q8_0", slice(0, 40, 3))],
        # a fused layer: 4-bit pieces beside an 8-bit one, rows picked out of order
        [("Q4_1", slice(5, 22)), ("Q8_0", np.array([39, 0, 7, 7, 12])), ("Q4_0", slice(0, 11))],
        [("Q4_0", np.array([2, 30, 31])), ("Q4_1", slice(16, 40))],
        # Q5_0 and Q5_1 as 8-bit codes, alone and beside 4-bit pieces
        [("Q5_0", slice(0, ROWS))],
        [("Q5_1", slice(1, 40, 2)), ("Q4_0", slice(0, 9)), ("Q5_0", np.array([4, 4, 0]))],
    ],
)
@pytest.mark.parametrize("sliced", [False, True])
def test_the_c_repacker_writes_what_the_numpy_packer_writes(pieces, sliced, monkeypatch):
    """gguf_repack.c reads the mapped blocks and writes the kernel's layout directly:
    byte for byte what decode_blocks + pack_grid_rows give, padding rows included.
    Sliced: a long row range goes in slices of 16 rows (as a file's tensors go in slices
    of 8 MiB), each landing where the one before ended."""
    if sliced:
        monkeypatch.setattr(gguf_blocks, "_SLICE_BYTES", 1)
    from engine.weights.gguf_blocks import BlockRows, repack_block_rows

    files = {t: _file_bytes(t, seed=10 + i)[0] for i, t in enumerate(BLOCK_TYPES)}
    block_rows = BlockRows([(files[t], taken, t) for t, taken in pieces], COLS)
    expected_codes, expected_scales = pack_grid_rows(
        join_rows([decode_blocks(files[t][taken], t, COLS) for t, taken in pieces])
    )
    codes, scales = repack_block_rows(block_rows)
    assert block_rows.rows == sum(len(files[t][taken]) for t, taken in pieces)
    assert torch.equal(codes, expected_codes)
    assert torch.equal(scales.view(torch.int16), expected_scales.view(torch.int16))


@pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q5_0"])
def test_an_offset_that_overflows_half_leaves_the_weight_to_the_dense_path(type_name):
    """-8 d (Q4_0) and -128 d (Q8_0) are exact in half unless they overflow: then the
    repacker says so and the layer is loaded dense, as offsets_exact says for numpy."""
    from engine.weights.gguf_blocks import BlockRows, repack_block_rows

    data = _file_bytes(type_name, seed=20)[0].copy()
    data[1, 0:2] = np.frombuffer(np.float16(30000.0).tobytes(), np.uint8)  # d of one block
    assert not offsets_exact(decode_blocks(data, type_name, COLS))
    assert repack_block_rows(BlockRows([(data, slice(0, ROWS), type_name)], COLS)) is None
