"""Per-token, per-128-group FP8 activation quantization: the torch reference and the Triton kernel.

The reference is checked against the recipe itself. The Triton kernel is
held to the reference where the interpreter can be right (DESIGN.md §3: its
float -> e4m3 cast drops the carry when rounding up crosses a power of two
and flushes e4m3 subnormals): its scales on any input (IEEE divisions, no
cast), its values on inputs that need no rounding (every value an e4m3
number times the group's power-of-two scale). Bit-exact values on arbitrary
inputs are a GPU test, skipped here.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.gpu_kernels.fp8_act_quant import (  # noqa: E402
    quantize_activations,
    quantize_activations_reference,
    quantize_activations_triton,
)
from engine.kv.quant import FP8_MAX  # noqa: E402

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the interpreter's float->fp8 cast rounds wrongly (DESIGN.md §3); GPU only",
)


def test_reference_follows_the_recipe(seed):
    """scale = amax / 448 per [token, 128 columns]; values within half an e4m3 step; zeros stay 0."""
    x = torch.randn(4, 300) * 2.0 ** torch.randint(-6, 6, (4, 1))
    x[2] = 0.0
    q, scales = quantize_activations_reference(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (4, 300)
    assert scales.dtype == torch.float32 and scales.shape == (4, 3)  # 128 + 128 + 44
    groups = [x[:, :128], x[:, 128:256], x[:, 256:]]
    amax = torch.stack([g.abs().amax(dim=1) for g in groups], dim=1)
    assert torch.equal(scales, amax.clamp_min(1e-10) / FP8_MAX)
    per_column = scales.repeat_interleave(128, dim=1)[:, :300]
    deq = q.float() * per_column
    # e4m3 has 3 mantissa bits: half a step is 2**-4 relative for normals and
    # 2**-10 in absolute (times the scale) for subnormals.
    assert (deq - x).abs().le(2.0**-4 * x.abs() + 2.0**-10 * per_column).all()
    nonzero = torch.tensor([True, True, False, True])
    for g in range(3):  # each group's largest value maps to exactly ±448
        assert (
            q[nonzero].float().abs().view(3, -1)[:, g * 128 : (g + 1) * 128].amax(1) == FP8_MAX
        ).all()
    assert not q[2].float().any() and torch.equal(scales[2], torch.full((3,), 1e-10 / FP8_MAX))


def test_reference_scales_are_one_division_on_every_device(device):
    """amax / 448 rounded once, as the kernel's div_rn: never amax * (1 / 448), which CUDA
    torch computes for `tensor / 448.0` and which differs in the last bit for these."""
    amax = torch.tensor([1.3, 3.7, 5.1, 0.77, 113.0, 2.0**-20 * 3])
    division = amax / torch.full_like(amax, FP8_MAX)
    reciprocal = amax * torch.tensor(1 / FP8_MAX, dtype=torch.float32)
    assert not torch.equal(division, reciprocal)  # the inputs tell the two apart
    x = torch.zeros(len(amax), 128)
    x[:, 5] = -amax
    _, scales = quantize_activations_reference(x.to(device))
    assert torch.equal(scales.cpu()[:, 0], division)


def test_triton_scales_equal_torch_on_any_input(seed, device):
    x = (torch.randn(5, 260) * 2.0 ** torch.randint(-8, 8, (5, 1))).to(device)
    _, ref_scales = quantize_activations_reference(x)
    _, scales = quantize_activations_triton(x)
    assert torch.equal(scales, ref_scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_values_equal_torch_on_exact_inputs(seed, device, dtype):
    """Each group: e4m3 values (subnormals included) times 2**j, one of them ±448 * 2**j."""
    rows, k = 3, 200
    raw = torch.randint(0, 256, (rows, k), dtype=torch.int32).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0  # no NaN bytes
    values = raw.view(torch.float8_e4m3fn).float()
    values[:, 0] = FP8_MAX
    values[:, 128] = -FP8_MAX  # the second (partial) group's amax too
    scale = 2.0 ** torch.randint(-10, 4, (rows, 1)).float()
    x = (values * scale).to(dtype).to(device)
    ref_q, ref_scales = quantize_activations_reference(x)
    q, scales = quantize_activations_triton(x)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))


def test_dispatch_uses_torch_off_the_gpu(seed):
    x = torch.randn(2, 130)
    q, s = quantize_activations(x)
    ref_q, ref_s = quantize_activations_reference(x)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)


def test_rejects_bad_inputs():
    for call, message in [
        (lambda: quantize_activations_reference(torch.randn(64)), "x must be 2-D"),
        (lambda: quantize_activations_triton(torch.randn(2, 64).int()), "x has dtype"),
        (lambda: quantize_activations_reference(torch.randn(2, 64), group=100), "power of two"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_is_bit_exact_with_torch_on_random_inputs(seed, dtype):
    x = (torch.randn(1024, 7168, device="cuda") * 3).to(dtype)
    x[7] = 0.0
    x[9, :200] = 1e-30  # tiny groups: subnormal e4m3 after scaling
    ref_q, ref_s = quantize_activations_reference(x)
    q, s = quantize_activations_triton(x)
    assert torch.equal(s, ref_s)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
