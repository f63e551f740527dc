"""The W4A16 GEMM against x @ dequantize_packed_int4(...).T in float32.

Tolerances (per element; `mag` = |x| @ |W|.T, the sum of absolute products):
- float32 activations and output: the dequantized weights are exact in fp32
  (a 4-bit value times a bf16 scale has 12 significant bits), so kernel and
  torch differ only in summation order: at most 2 * K * 2**-24 * mag.
- bf16 activations and output: the output's rounding, one bf16 ulp of |ref|
  (2**-7: the interpreter truncates, a GPU rounds to half that), plus on a
  GPU each weight rounded to bf16 before the dot (2**-9 relative, so at most
  2**-9 * mag); 2**-8 * mag covers that and the summation order.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.gpu_kernels.split_k import k_splits  # noqa: E402
from engine.gpu_kernels.w4a16 import w4a16_gemm  # noqa: E402
from tests.engine.gpu_kernels.references import (  # noqa: E402
    BF16_ULP,
    assert_within,
    int4_weight,
    summation_bound,
)

SHAPES = [(1, 64, 64), (5, 160, 256), (5, 256, 160), (3, 100, 70)]  # (M, K, N); K=100: odd tail


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_float32_matches_dequantized_weights(seed, device, m, k, n):
    packed, scale, weight = int4_weight(n, k, device=device)
    x = torch.randn(m, k, device=device)
    out = w4a16_gemm(x, packed, scale)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    assert_within(out, x @ weight.T, summation_bound(x, weight), f"w4a16 {m}x{k}x{n}")


def test_bf16_activations_and_output(seed, device):
    m, k, n = 5, 160, 96
    packed, scale, weight = int4_weight(n, k, device=device)
    x = torch.randn(m, k, device=device).bfloat16()
    out = w4a16_gemm(x, packed, scale)
    assert out.dtype == torch.bfloat16
    ref = x.float() @ weight.T
    mag = x.float().abs() @ weight.abs().T
    assert_within(out, ref, BF16_ULP * ref.abs() + 2.0**-8 * mag, "w4a16 bf16")


@pytest.mark.parametrize("m,k,n,group", [(2, 256, 48, 128), (1, 200, 40, 64)])
def test_other_group_sizes(seed, device, m, k, n, group):
    packed, scale, weight = int4_weight(n, k, group, device=device)
    x = torch.randn(m, k, device=device)
    out = w4a16_gemm(x, packed, scale, group_size=group)
    assert_within(out, x @ weight.T, summation_bound(x, weight), f"w4a16 group {group}")


def test_strided_activations_and_preallocated_output(seed, device):
    """Row strides are honoured: x a column slice of a wider tensor, out a slice of a wider one."""
    m, k, n = 4, 96, 40
    packed, scale, weight = int4_weight(n, k, device=device)
    wide = torch.randn(m, k + 24, device=device)
    x = wide[:, 8 : 8 + k]
    big = torch.full((m, n + 7), float("nan"), device=device)
    out = w4a16_gemm(x, packed, scale, out=big[:, :n])
    assert out.data_ptr() == big.data_ptr()
    assert_within(big[:, :n], x @ weight.T, summation_bound(x, weight), "w4a16 strided")
    assert big[:, n:].isnan().all()  # nothing written past the output's columns


def test_empty_inputs(device):
    packed, scale, _ = int4_weight(8, 64, device=device)
    assert w4a16_gemm(torch.empty(0, 64, device=device), packed, scale).shape == (0, 8)


def test_rejects_bad_inputs(device):
    packed, scale, _ = int4_weight(16, 64, device=device)
    x = torch.randn(2, 64, device=device)
    cases = [
        (lambda: w4a16_gemm(x.int(), packed, scale), "x has dtype torch.int32"),
        (lambda: w4a16_gemm(x[None], packed, scale), "x must be 2-D"),
        (lambda: w4a16_gemm(x, packed.long(), scale), "weight_packed has dtype torch.int64"),
        (lambda: w4a16_gemm(x, packed[:, :7], scale), r"weight_packed has shape \(16, 7\)"),
        (lambda: w4a16_gemm(x[:, :48], packed, scale), r"eight int4 values per int32 along K"),
        (lambda: w4a16_gemm(x, packed, scale[:, :1]), r"weight_scale has shape \(16, 1\)"),
        (lambda: w4a16_gemm(x, packed, scale, group_size=0), "group_size must be positive"),
        (
            lambda: w4a16_gemm(x, packed, scale, out=torch.empty(2, 15, device=device)),
            r"out has shape",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize("splits", [2, 3, 9])  # 9: more splits than K tiles, some empty
def test_split_k_sums_to_the_same_product(seed, device, splits):
    packed, scale, weight = int4_weight(40, 200, device=device)
    x = torch.randn(3, 200, device=device)
    out = w4a16_gemm(x, packed, scale, splits=splits)
    assert_within(out, x @ weight.T, summation_bound(x, weight), f"w4a16 split {splits}")
    torch.testing.assert_close(out, w4a16_gemm(x, packed, scale, splits=1), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="splits must be at least 1"):
        w4a16_gemm(x, packed, scale, splits=0)


def test_split_k_plan_fills_an_h200_at_decode_sizes():
    decode = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128)  # tiles(m) on a GPU for m <= 16
    assert k_splits(1, 7168, 18432, decode, 132) == 3  # 112 tiles -> 336 programs
    assert k_splits(1, 18432, 7168, decode, 132) == 1  # 288 tiles already
    assert k_splits(1, 2048, 512, decode, 132) == 1  # 4 K tiles: too few to split
    assert k_splits(1, 2048, 7168, decode, 132) == 9  # 32 tiles -> 288 programs
    assert k_splits(32, 7168, 18432, decode, 132) == 1  # prefill-sized M: no split
