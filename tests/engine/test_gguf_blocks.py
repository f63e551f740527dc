"""GGUF Q4_0/Q4_1/Q8_0 blocks read into grid codes: exactly the values gguf dequantizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from engine.cpu_kernels.library import unavailable
from engine.layers.cpu_grid_weights import GridWeight
from engine.weights.gguf_blocks import BLOCK_TYPES, decode_blocks, join_rows, pack_grid_rows

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
