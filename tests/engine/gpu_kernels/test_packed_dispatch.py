"""The packed linear methods' GPU path (engine/layers/gpu_linear.py) against their own
CPU dequantization, under the interpreter: the layer's parameters as the loader fills
them go straight into the Triton kernels."""

from __future__ import annotations

import torch

from engine.layers.gpu_linear import fp8_block_grid, fp8_linear, int4_linear
from engine.layers.linear_methods import MethodLinear
from engine.layers.packed_methods import Fp8BlockMethod, Int4GroupMethod
from engine.weights.fp8_block_format import quantize_fp8_block
from engine.weights.int4_packed import pack_int4
from engine.weights.meta_init import materialize_parameters
from engine.weights.packed_pieces import Fp8Piece, Int4Piece


def _layer(method, in_features: int, out_features: int, piece) -> MethodLinear:
    layer = MethodLinear(in_features, out_features, bias=True)
    method.install(layer)
    bias = layer.bias.detach().clone()
    materialize_parameters(layer, torch.device("cpu"))
    method.load_rows(layer, 0, piece)
    with torch.no_grad():
        layer.bias.copy_(torch.randn_like(bias))
    return layer


def test_int4_layers_run_the_w4a16_kernel_on_their_own_words(seed, monkeypatch):
    from engine.cpu_kernels import library

    # The checkpoint's word order, as on a GPU (a CPU with the C kernels re-tiles).
    monkeypatch.setattr(library, "unavailable", lambda: "the GPU layout, for this test")
    values = torch.randint(-8, 8, (48, 96))
    scales = (torch.rand(48, 3) * 0.1).to(torch.bfloat16)
    method = Int4GroupMethod(32)
    layer = _layer(method, 96, 48, Int4Piece(pack_int4(values), scales, 96, 32))
    x = torch.randn(5, 96)
    want = torch.nn.functional.linear(
        x, method.dequantize(layer, slice(0, 48), x.dtype), layer.bias
    )
    got = int4_linear(layer, x.view(5, 1, 96), 32).view(5, 48)
    # Same float32 weights; only the summation order differs.
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_fp8_layers_hold_their_block_grid_and_run_the_block_kernel(seed):
    weight = torch.randn(200, 256)
    values, scale_inv = quantize_fp8_block(weight)
    method = Fp8BlockMethod((128, 128), 0)
    layer = _layer(method, 256, 200, Fp8Piece.from_checkpoint(values, scale_inv, (128, 128)))
    grid = fp8_block_grid(layer)
    assert grid is layer.weight_scale and torch.equal(grid, scale_inv)  # held, not derived
    x = torch.randn(3, 256)
    want = torch.nn.functional.linear(
        x, method.dequantize(layer, slice(0, 200), x.dtype), layer.bias
    )
    got = fp8_linear(layer, x, grid, method.block)
    # The activations are quantized to e4m3 per 128 values (the DeepSeek recipe):
    # each product term is off by at most 2**-4 relative; over 256 terms of
    # random sign that stays well under 5% of the output's scale.
    scale = want.abs().max()
    assert (got - want).abs().max() <= 0.05 * scale


def test_rows_that_start_inside_a_block_have_no_grid():
    weight = torch.randn(256, 128)
    values, scale_inv = quantize_fp8_block(weight)
    piece = Fp8Piece.from_checkpoint(values, scale_inv, (128, 128)).narrow(0, 64, 128)
    method = Fp8BlockMethod((128, 128), 0)
    layer = _layer(method, 128, 128, piece)
    assert method.scale_rows == 1  # per-row scales
    assert fp8_block_grid(layer) is None  # rows 64..191 cross two scales
