"""round_to_e4m3 / quantize_rows_e4m3 (the FP8 tensor-core operands of decode) against torch.

The helper rounds in fp32 and integer arithmetic, so the interpreter (whose
own e4m3 cast rounds wrongly, DESIGN.md §3) must give torch's cast bit for
bit: ties to even, the carry across a power of two, subnormals, saturation.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.attention.triton.common import quantize_rows_e4m3, round_to_e4m3  # noqa: E402
from engine.kv.quant import FP8_MAX  # noqa: E402

BLOCK = 1024


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    y = round_to_e4m3(x).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    tl.store(y_ptr + i, y, mask=i < n)


@triton.jit
def _rows_kernel(x_ptr, q_ptr, s_ptr, R: tl.constexpr, C: tl.constexpr, ROW_MAX: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    q, scale = quantize_rows_e4m3(x, ROW_MAX)
    tl.store(q_ptr + r[:, None] * C + c[None, :], q.to(tl.uint8, bitcast=True))
    tl.store(s_ptr + r, scale)


def _torch_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _hard_values(device) -> torch.Tensor:
    """Every e4m3 value, the midpoints between neighbours (ties), points just off
    them, values past the range, zeros of both signs and random magnitudes."""
    exact = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    exact = exact[exact.isfinite()].unique()
    mids = (exact[1:] + exact[:-1]) / 2
    nudged = torch.cat([mids * (1 + 2**-20), mids * (1 - 2**-20), mids.nextafter(mids * 2)])
    extremes = torch.tensor([0.0, -0.0, 448.0, 449.0, 464.0, 480.0, 1e9, -1e9, 2**-12, -(2**-10)])
    rand = torch.randn(4096) * torch.exp2(torch.randint(-14, 10, (4096,)).float())
    values = torch.cat([exact, mids, nudged, extremes, rand])
    return torch.cat([values, -values]).to(device)


def test_round_to_e4m3_is_torchs_cast_bit_for_bit(device, seed):
    x = _hard_values(device)
    out = torch.empty(x.numel(), dtype=torch.uint8, device=device)
    _round_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    expected = _torch_e4m3(x).view(torch.uint8)
    wrong = (out != expected).nonzero().flatten()
    assert wrong.numel() == 0, [(x[i].item(), out[i].item(), expected[i].item()) for i in wrong[:8]]


@pytest.mark.parametrize("row_max", [448.0, 256.0])
def test_quantize_rows_scales_each_row_to_its_maximum(device, seed, row_max):
    rows, cols = 16, 64
    x = (
        torch.randn(rows, cols, device=device)
        * torch.exp2(torch.arange(rows) - 8.0).to(device)[:, None]
    )
    x[3] = 0.0  # an all-zero row keeps scale 1
    q = torch.empty(rows, cols, dtype=torch.uint8, device=device)
    scales = torch.empty(rows, device=device)
    _rows_kernel[(1,)](x, q, scales, R=rows, C=cols, ROW_MAX=row_max)
    amax = x.abs().amax(1)
    expected_scales = torch.where(amax > 0, amax / row_max, torch.ones_like(amax))
    torch.testing.assert_close(scales, expected_scales, rtol=1e-6, atol=0)
    expected = _torch_e4m3(x / scales[:, None]).view(torch.uint8)
    assert torch.equal(q, expected)
    values = q.view(torch.float8_e4m3fn).float()
    assert values.abs().amax(1)[amax > 0].eq(row_max).all()  # the largest maps to ROW_MAX
    # Each value within half an e4m3 step (2^-4 relative, or 2^-10 absolute below 2^-6).
    error = (values * scales[:, None] - x).abs()
    bound = torch.maximum(x.abs() * 2**-4, scales[:, None] * 2**-10)
    assert (error <= bound * (1 + 1e-6)).all()
