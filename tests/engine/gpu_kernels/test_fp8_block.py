"""The FP8 block-scaled GEMM against dequantized activations @ dequantized weights in float32.

Activations are quantized by the torch reference (fp8_act_quant), whose
casts are right everywhere (DESIGN.md §3: the interpreter's float -> e4m3
cast is not), so these tests measure the GEMM alone.

Tolerances (per element; `mag` = |x_deq| @ |W_deq|.T):
- every e4m3 x e4m3 product is exact in fp32; the kernel scales each 128-wide
  partial sum by act_scale * weight_scale (two more fp32 roundings), so
  kernel and torch differ by summation order: 2 * K * 2**-24 * mag bounds it;
- on a GPU with FP8 tensor cores, Hopper's FP8 MMA keeps about 14 bits while
  accumulating inside one tile (DeepSeek-V3 report, §3.3.2), hence 2**-13 *
  mag more there;
- BF16 output: one bf16 ulp of |ref| (2**-7; the interpreter truncates).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.gpu_kernels.fp8_act_quant import quantize_activations_reference  # noqa: E402
from engine.gpu_kernels.fp8_block_gemm import fp8_block_gemm, fp8_block_linear  # noqa: E402
from tests.engine.gpu_kernels.references import (  # noqa: E402
    BF16_ULP,
    assert_within,
    dequantize_activations,
    fp8_weight,
    summation_bound,
)

SHAPES = [(1, 64, 64), (5, 160, 256), (5, 256, 160), (3, 300, 200)]  # (M, K, N)


def gemm_tolerance(x_deq, weight, device) -> torch.Tensor:
    tol = summation_bound(x_deq, weight)
    if device.type == "cuda":
        tol = tol + 2.0**-13 * (x_deq.abs() @ weight.abs().T)
    return tol


def quantized_activations(m, k, device, group=128):
    x = torch.randn(m, k, device=device) * 2.0 ** torch.randint(-2, 3, (m, 1), device=device)
    x_q, x_scale = quantize_activations_reference(x, group)
    return x_q, x_scale, dequantize_activations(x_q, x_scale, group)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_bf16_output_matches_dequantized(seed, device, m, k, n):
    weight, scale_inv, w_deq = fp8_weight(n, k, device=device)
    x_q, x_scale, x_deq = quantized_activations(m, k, device)
    out = fp8_block_gemm(x_q, x_scale, weight, scale_inv)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    ref = x_deq @ w_deq.T
    tol = BF16_ULP * ref.abs() + gemm_tolerance(x_deq, w_deq, device)
    assert_within(out, ref, tol, f"fp8 block {m}x{k}x{n}")


def test_float32_output_on_partial_blocks(seed, device):
    """K = 300 and N = 200: partial last blocks along both dimensions, tight (fp32 output)."""
    m, k, n = 3, 300, 200
    weight, scale_inv, w_deq = fp8_weight(n, k, device=device)
    x_q, x_scale, x_deq = quantized_activations(m, k, device)
    out = fp8_block_gemm(x_q, x_scale, weight, scale_inv, out_dtype=torch.float32)
    assert_within(out, x_deq @ w_deq.T, gemm_tolerance(x_deq, w_deq, device), "fp8 fp32")


@pytest.mark.parametrize("splits", [2, 3])  # 3 slices of a 3-tile K: one tile each
def test_split_k_sums_to_the_same_product(seed, device, splits):
    m, k, n = 2, 300, 200
    weight, scale_inv, w_deq = fp8_weight(n, k, device=device)
    x_q, x_scale, x_deq = quantized_activations(m, k, device)
    out = fp8_block_gemm(x_q, x_scale, weight, scale_inv, out_dtype=torch.float32, splits=splits)
    assert_within(out, x_deq @ w_deq.T, gemm_tolerance(x_deq, w_deq, device), f"split {splits}")
    whole = fp8_block_gemm(x_q, x_scale, weight, scale_inv, out_dtype=torch.float32, splits=1)
    torch.testing.assert_close(out, whole, atol=1e-5, rtol=1e-5)


def test_other_block_shape(seed, device):
    """64x64 blocks (activation groups of 64): the block is a parameter, not a constant."""
    m, k, n = 2, 160, 100
    weight, scale_inv, w_deq = fp8_weight(n, k, block=(64, 64), device=device)
    x_q, x_scale, x_deq = quantized_activations(m, k, device, group=64)
    out = fp8_block_gemm(x_q, x_scale, weight, scale_inv, block=(64, 64), out_dtype=torch.float32)
    assert_within(out, x_deq @ w_deq.T, gemm_tolerance(x_deq, w_deq, device), "fp8 64x64")


def test_linear_quantizes_each_token(seed, device):
    """fp8_block_linear = per-token quantization + the GEMM, over any leading dimensions."""
    k, n = 160, 48
    weight, scale_inv, _ = fp8_weight(n, k, device=device)
    x = torch.randn(2, 3, k, device=device).bfloat16()
    out = fp8_block_linear(x, weight, scale_inv)
    assert out.shape == (2, 3, n) and out.dtype == torch.bfloat16
    x_q, x_scale = quantize_activations_reference(x.view(6, k))
    expected = fp8_block_gemm(x_q, x_scale, weight, scale_inv)
    # On CPU both quantize with torch; on a GPU the kernel's bytes equal torch's.
    assert torch.equal(out.view(6, n), expected)


def test_empty_inputs(device):
    weight, scale_inv, _ = fp8_weight(8, 64, device=device)
    x_q, x_scale = quantize_activations_reference(torch.empty(0, 64, device=device))
    assert fp8_block_gemm(x_q, x_scale, weight, scale_inv).shape == (0, 8)


def test_rejects_bad_inputs(device):
    weight, scale_inv, _ = fp8_weight(16, 160, device=device)
    x_q, x_scale = quantize_activations_reference(torch.randn(2, 160, device=device))
    cases = [
        (lambda: fp8_block_gemm(x_q.float(), x_scale, weight, scale_inv), "x_q has dtype"),
        (lambda: fp8_block_gemm(x_q, x_scale.half(), weight, scale_inv), "x_scale has dtype"),
        (lambda: fp8_block_gemm(x_q, x_scale, weight.view(torch.uint8), scale_inv),
         "weight has dtype torch.uint8"),
        (lambda: fp8_block_gemm(x_q, x_scale, weight[:, :128], scale_inv[:, :1]),
         r"weight has shape \(16, 128\)"),
        (lambda: fp8_block_gemm(x_q, x_scale[:, :1], weight, scale_inv),
         r"x_scale has shape \(2, 1\)"),
        (lambda: fp8_block_gemm(x_q, x_scale, weight, scale_inv.T), "weight_scale_inv has shape"),
        (lambda: fp8_block_gemm(x_q, x_scale, weight, scale_inv, block=(128, 100)),
         "power of two"),
        (lambda: fp8_block_linear(torch.randn(2, 160, device=device).int(), weight, scale_inv),
         "x has dtype"),
    ]  # fmt: skip
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
