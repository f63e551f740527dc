"""The CPU kernels for packed INT4 and FP8-block weights, and the methods that call them.

Tolerances are error bounds, not fits. Where a kernel's weights equal the
reference's (FP8: the same float32 products; INT4 float mode: exact), the
only difference is float32 summation, and for a sum of n products in any
order |error| <= gamma_n * sum|x_k w_k| with gamma_n = n u / (1 - n u),
u = 2**-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
The int8 mode is checked the same way against its own definition (x
quantized per 32 to int8, times the exact weight), and against the
unquantized product by the size int8 rounding has.
"""

from __future__ import annotations

import pytest
import torch

from engine.cpu_kernels import library
from engine.cpu_kernels.packed_matmul import (
    fp8_block_dequantize,
    fp8_block_matmul,
    int4_matmul,
    tile_rows,
    untile_rows,
)
from engine.kv.quant import fp8_bits_to_half
from engine.layers.linear import FusedLinear
from engine.layers.linear_methods import MethodLinear
from engine.layers.packed_methods import Fp8BlockMethod, Int4GroupMethod
from engine.weights.fp8_block_format import quantize_fp8_block
from engine.weights.int4_packed import pack_int4
from engine.weights.packed_pieces import Fp8Piece, Int4Piece

pytestmark = pytest.mark.skipif(
    bool(library.unavailable()), reason=f"CPU kernels: {library.unavailable()}"
)
U = 2.0**-24


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def bound(x: torch.Tensor, w: torch.Tensor, terms: int) -> torch.Tensor:
    """gamma_terms * (|x| @ |w|^T), in float64."""
    return gamma(terms) * (x.double().abs() @ w.double().abs().T)


def int4_weight(rows: int, cols: int, group: int, gen: torch.Generator):
    values = torch.randint(-8, 8, (rows, cols), generator=gen)
    scales = (torch.rand(rows, cols // group, generator=gen) * 0.02 + 1e-3).bfloat16()
    dense = values.double() * scales.double().repeat_interleave(group, dim=1)
    return pack_int4(values), scales, dense


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel quantizes it: per 32 values, round(x * (127 / amax)) * (amax / 127),
    each step in float32 as the C does (torch's `127 / t` is a reciprocal times 127,
    which rounds differently, hence the true division)."""
    groups = x.float().reshape(x.shape[0], -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    q = torch.round(groups * inv).clamp(-128, 127)
    return (q.double() * (amax / 127.0).double()).reshape(x.shape)


def test_tiles_are_a_transpose_of_each_block_of_sixteen_rows():
    words = torch.arange(32 * 5, dtype=torch.int32).reshape(32, 5)
    tiled = tile_rows(words)
    assert tiled.shape == words.shape
    assert torch.equal(tiled[:16].reshape(-1), words[:16].T.reshape(-1))
    assert torch.equal(untile_rows(tiled), words)
    with pytest.raises(ValueError, match="tiles of 16"):
        tile_rows(words[:20])


@pytest.mark.parametrize(
    "rows, cols, group", [(16, 128, 32), (48, 96, 32), (32, 320, 64), (32, 192, 96), (16, 256, 128)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_matmul_float_mode_is_the_exact_weight_in_float32(rows, cols, group, dtype):
    gen = torch.Generator().manual_seed(rows * cols + group)
    packed, scales, dense = int4_weight(rows, cols, group, gen)
    bias = torch.randn(rows, generator=gen)
    for m in (1, 5, 9, 17):  # register blocks of 8 activation rows, and their tails
        x = (torch.randn(m, cols, generator=gen) * 3).to(dtype)
        got = int4_matmul(
            x, tile_rows(packed), tile_rows(scales), group, bias, torch.float32, False
        )
        want = x.double() @ dense.T + bias.double()
        # cols products and the bias, summed in float32
        tol = bound(x, dense, cols + 1) + gamma(1) * bias.double().abs()
        assert ((got.double() - want).abs() <= tol).all()


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_matmul_int8_mode_is_the_exact_weight_times_int8_activations(group, dtype):
    gen = torch.Generator().manual_seed(group)
    rows, cols = 48, 256
    packed, scales, dense = int4_weight(rows, cols, group, gen)
    for m in (1, 3, 8, 11):
        x = (torch.randn(m, cols, generator=gen) * 2).to(dtype)
        got = int4_matmul(x, tile_rows(packed), tile_rows(scales), group, None, torch.float32)
        quantized = int8_activations(x)
        # Integer sums are exact; per group one rounded scale product, then cols / 32
        # float32 accumulations.
        tol = bound(quantized, dense, cols // 32 + 2)
        assert ((got.double() - quantized @ dense.T).abs() <= tol).all()
        # int8 rounding per 32 (steps of amax / 127): about 0.6% RMS on Gaussian rows
        exact = x.double() @ dense.T
        assert (got.double() - exact).pow(2).mean().sqrt() <= 0.01 * exact.pow(2).mean().sqrt()


def test_int4_matmul_refuses_what_it_cannot_read():
    gen = torch.Generator().manual_seed(0)
    packed, scales, _ = int4_weight(16, 64, 16, gen)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        int4_matmul(x, tile_rows(packed), tile_rows(scales), 16)
    packed, scales, _ = int4_weight(16, 96, 32, gen)
    with pytest.raises(ValueError, match="packed must be"):
        int4_matmul(x, packed, scales, 32)  # 64 columns of x for 96 of weight
    assert int4_matmul(torch.empty(0, 96), packed, scales, 32).shape == (0, 16)


def fp8_piece(rows, cols, row_start, col_start, gen, scale_rows=1):
    """A slice of an FP8 block-scaled weight starting inside a 128x128 block: (values,
    scales with one row per `scale_rows` weight rows, col_offset, the dequantized weight).
    scale_rows 128 is the checkpoint's grid (rows that start on a block)."""
    weight = torch.randn(row_start + rows, col_start + cols, generator=gen)
    values, scale_inv = quantize_fp8_block(weight)
    piece = Fp8Piece.from_checkpoint(values, scale_inv, (128, 128))
    piece = piece.narrow(0, row_start, rows).narrow(1, col_start, cols)
    values, row_scales = piece.values.contiguous(), piece.row_scales()
    if scale_rows == 1:
        scales = row_scales
    else:
        assert scale_rows == 128 and piece.row_offset == 0
        scales = piece.scales.contiguous()
    # Fp8BlockMethod.dequantize's arithmetic: the float16 of value / 256, times scale * 256.
    expanded = (row_scales * 256).repeat_interleave(128, dim=1)[:, piece.col_offset :][:, :cols]
    return values, scales, piece.col_offset, fp8_bits_to_half(values).float() * expanded


@pytest.mark.parametrize(
    "rows, cols, row_start, col_start, scale_rows",
    [
        (16, 128, 0, 0, 128),
        (300, 200, 0, 0, 128),  # three blocks of rows, the last partial
        (7, 40, 0, 112, 128),
        (16, 128, 0, 0, 1),
        (40, 260, 100, 70, 1),
        (45, 500, 3, 17, 1),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_block_matmul_is_the_dequantized_weight_in_float32(
    rows, cols, row_start, col_start, scale_rows, dtype
):
    gen = torch.Generator().manual_seed(rows + cols)
    values, scales, offset, weight = fp8_piece(rows, cols, row_start, col_start, gen, scale_rows)
    bias = torch.randn(rows, generator=gen)
    for m in (1, 3, 8, 9):
        x = torch.randn(m, cols, generator=gen).to(dtype)
        got = fp8_block_matmul(x, values, scales, offset, 128, scale_rows, bias, torch.float32)
        want = x.double() @ weight.double().T + bias.double()
        tol = bound(x, weight, cols + 1) + gamma(1) * bias.double().abs()
        assert ((got.double() - want).abs() <= tol).all()
    with pytest.raises(ValueError, match="refused"):  # blocks narrower than a chunk of 32
        fp8_block_matmul(x, values, torch.ones(rows, (cols - 1) // 16 + 1), 0, 16, 1)
    with pytest.raises(ValueError, match="one row per 2 weight rows"):
        fp8_block_matmul(x, values, scales, offset, 128, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_block_dequantize_is_torch_dequantization_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(5)
    values, scales, offset, weight = fp8_piece(33, 300, 5, 90, gen)
    assert torch.equal(
        fp8_block_dequantize(values, scales, offset, 128, 1, dtype), weight.to(dtype)
    )
    values, scales, offset, weight = fp8_piece(200, 300, 0, 90, gen, scale_rows=128)
    assert torch.equal(
        fp8_block_dequantize(values, scales, offset, 128, 128, dtype), weight.to(dtype)
    )
    # every e4m3 byte but the two NaNs (0x7F, 0xFF), subnormals included, one per row
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    every = codes.view(torch.float8_e4m3fn).reshape(-1, 1).expand(-1, 64).contiguous()
    ones = torch.ones(every.shape[0], 1)  # scale 1: the plain values
    got = fp8_block_dequantize(every, ones, 0, 128, 1, torch.float32)
    assert torch.equal(got, every.float())


def test_fp8_kernels_read_scale_row_n_over_scale_rows():
    """Any rows per scale row, odd ones included (two weight rows of a pass then read
    different scale rows)."""
    gen = torch.Generator().manual_seed(6)
    values = (torch.randn(11, 96, generator=gen) * 50).to(torch.float8_e4m3fn)
    grid = torch.rand(4, 1, generator=gen) + 0.5  # ceil(11 / 3) rows of scales
    weight = values.float() * grid.repeat_interleave(3, dim=0)[:11]
    dense = fp8_block_dequantize(values, grid, 0, 128, 3, torch.float32)
    assert torch.equal(dense, weight)
    x = torch.randn(2, 96, generator=gen)
    got = fp8_block_matmul(x, values, grid, 0, 128, 3, None, torch.float32)
    assert ((got.double() - x.double() @ weight.double().T).abs() <= bound(x, weight, 96)).all()


def packed_layer(method, rows: int, cols: int, layer=None) -> MethodLinear:
    layer = layer or MethodLinear(cols, rows, bias=False, device="meta")
    method.install(layer)
    return layer.to_empty(device="cpu")


def test_int4_layers_tile_at_load_and_multiply_through_the_kernel():
    gen = torch.Generator().manual_seed(7)
    packed, scales, dense = int4_weight(64, 128, 32, gen)
    layer = packed_layer(Int4GroupMethod(32), 64, 128)
    for start in (0, 32):  # two pieces, as fused shards arrive
        piece = Int4Piece(packed[start : start + 32], scales[start : start + 32], 128, 32)
        layer.method.load_rows(layer, start, piece)
    assert layer.int4_tiles and torch.equal(layer.weight_packed, tile_rows(packed))
    assert layer.method.weight_bytes(layer) == packed.numel() * 4 + scales.numel() * 2
    # dequantize reads the tiles in the checkpoint's order, any rows
    torch.testing.assert_close(
        layer.method.dequantize(layer, slice(5, 40), torch.float64), dense[5:40], rtol=0, atol=0
    )
    x = torch.randn(3, 128, generator=gen)
    exact = x.double() @ dense.T
    assert ((layer(x).double() - exact).abs() <= bound(x, dense, 128)).all()  # float32: exact
    x16 = x.bfloat16()
    int8 = int8_activations(x16) @ dense.T
    out = layer(x16)
    assert out.dtype == torch.bfloat16
    # int8 activations, then the output rounded to BF16 (half an ulp: at most 2**-8 relative)
    tol = bound(int8_activations(x16), dense, 6) + 2.0**-8 * int8.abs()
    assert ((out.double() - int8).abs() <= tol).all()
    layer.method.cpu_activations = "float"
    exact16 = x16.double() @ dense.T
    assert (
        (layer(x16).double() - exact16).abs() <= bound(x16, dense, 128) + 2.0**-8 * exact16.abs()
    ).all()


def test_int4_layers_that_cannot_tile_use_the_torch_path():
    gen = torch.Generator().manual_seed(8)
    packed, scales, dense = int4_weight(40, 64, 32, gen)
    # 40 rows: not tiles of 16
    layer = packed_layer(Int4GroupMethod(32), 40, 64)
    layer.method.load_rows(layer, 0, Int4Piece(packed, scales, 64, 32))
    assert not layer.int4_tiles and torch.equal(layer.weight_packed, packed)
    x = torch.randn(2, 64, generator=gen)
    torch.testing.assert_close(layer(x).double(), x.double() @ dense.T, rtol=1e-6, atol=1e-6)
    # fused shards of 24 and 40 rows: a tile would straddle the two copies
    fused = packed_layer(Int4GroupMethod(32), 64, 64, FusedLinear(64, {"a": 24, "b": 40}))
    assert not fused.method.tileable
    # groups of 16 columns: no kernel reads them
    narrow = packed_layer(Int4GroupMethod(16), 32, 64)
    assert not narrow.method.tileable


def test_fp8_layers_take_the_kernel_for_short_inputs_and_c_dequantization_for_long(
    monkeypatch,
):
    import engine.cpu_kernels.packed_matmul as kernels

    gen = torch.Generator().manual_seed(9)
    values, scales, _, weight = fp8_piece(48, 200, 0, 0, gen, scale_rows=128)
    layer = packed_layer(Fp8BlockMethod((128, 128), 0), 48, 200)
    layer.method.load_rows(layer, 0, Fp8Piece(values, scales, 0, 0, (128, 128)))
    assert layer.method.scale_rows == 128 and layer.weight_scale.shape == (1, 2)
    used = []
    for name in ("fp8_block_matmul", "fp8_block_dequantize"):
        original = getattr(kernels, name)
        monkeypatch.setattr(
            kernels, name, lambda *a, _f=original, _n=name, **k: used.append(_n) or _f(*a, **k)
        )
    for m in (1, 8, 30):
        x = torch.randn(m, 200, generator=gen)
        want = x.double() @ weight.double().T
        assert ((layer(x).double() - want).abs() <= bound(x, weight, 200)).all()
    assert used == ["fp8_block_matmul", "fp8_block_matmul", "fp8_block_dequantize"]
    # without the kernels: torch's chunks, the same values
    monkeypatch.setattr(library, "unavailable", lambda: "switched off")
    x = torch.randn(3, 200, generator=gen)
    assert (
        (layer(x).double() - x.double() @ weight.double().T).abs() <= bound(x, weight, 200)
    ).all()
    assert len(used) == 3
