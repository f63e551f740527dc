"""FP8 e4m3 quantization against torch's own cast."""

from __future__ import annotations

import torch

from engine.kv.quant import (
    FP8_DTYPE,
    FP8_MAX,
    calibrate_scale,
    dequantize_fp8,
    fp8_bits_to_half,
    quantize_fp8,
)


def test_quantize_equals_torch_cast_after_clamp():
    x = torch.randn(10_000) * 300
    scale = 0.7
    expected = torch.clamp(x / scale, -FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    got = quantize_fp8(x, scale)
    assert got.dtype == FP8_DTYPE
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))


def test_values_beyond_range_saturate_never_nan():
    x = torch.tensor([479.0, 480.0, 1e6, -1e6, float("inf"), -float("inf"), 448.0, -500.0])
    q = quantize_fp8(x, 1.0).float()
    assert not torch.isnan(q).any()
    assert q.tolist() == [448.0, 448.0, 448.0, -448.0, 448.0, -448.0, 448.0, -448.0]
    # The clamp is ours, not torch's: whether torch's cast saturates differs by
    # build and device (DESIGN.md §3 saw NaN), so the result must not depend on it.


def test_bit_level_dequantization_is_exact_for_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    reference = codes.view(FP8_DTYPE).float()
    finite = ~torch.isnan(reference)
    got = fp8_bits_to_half(codes).float() * 256
    assert torch.equal(got[finite], reference[finite])
    # Negative zero keeps its sign.
    assert torch.signbit(got[0x80])


def test_dequantize_applies_scale_in_requested_dtype():
    x = torch.randn(64, 8) * 5
    scale = calibrate_scale(x)
    q = quantize_fp8(x, scale)
    for dtype in (torch.float32, torch.bfloat16):
        back = dequantize_fp8(q, scale, dtype)
        assert back.dtype == dtype
        expected = (q.float() * scale).to(dtype)
        assert torch.allclose(back.float(), expected.float(), rtol=1e-2, atol=1e-6)
    # Round trip error is bounded by e4m3's relative precision (3 mantissa bits).
    back = dequantize_fp8(q, scale)
    assert ((back - x).abs() <= x.abs() * 2**-4 + scale * 2**-9).all()


def test_calibrated_scale_leaves_headroom():
    x = torch.tensor([-3.0, 2.0, 0.5])
    scale = calibrate_scale(x)
    assert scale * FP8_MAX > 3.0
    assert calibrate_scale(torch.zeros(4)) > 0
