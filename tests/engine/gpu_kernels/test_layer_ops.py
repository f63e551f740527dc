"""The layer-op kernels (engine/gpu_kernels/layer_ops.py) against TorchLayerOps' arithmetic.

On CPU the kernels run under Triton's interpreter, whose float32 -> bf16
cast truncates instead of rounding to nearest (DESIGN.md §3). So:

- float32 inputs (no down-cast anywhere) are held to TorchLayerOps itself:
  bit for bit where the operations are the same IEEE ones in the same order
  (rotary, the residual sum), within a derived bound where they are not (the
  norm's sum of squares in another order, numpy's exp against torch's).
- bf16 inputs are held to `RoundedOps`: TorchLayerOps' arithmetic in float32
  with each rounding to bf16 made explicit. With round-to-nearest it equals
  TorchLayerOps bit for bit (the first test shows it), so its rounding points
  are torch's; with the interpreter's truncation in their place, the kernels
  must match it: exactly for rotary and the residual sum, within a step or two
  of bf16 where float32 differences may flip a rounding (norm, silu). On a
  GPU the same tests compare with round-to-nearest, i.e. with torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from engine.gpu_kernels import layer_ops as kernels  # noqa: E402
from engine.layers.layer_ops import TORCH_LAYER_OPS  # noqa: E402
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq  # noqa: E402

ON_GPU = torch.cuda.is_available()
U32 = 2.0**-24  # float32 unit roundoff: round to nearest is within U32 * |x|
BF16_STEP = 2.0**-7  # a bf16 step (ulp) is at most 2^-7 * |x|


def round_nearest(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 -> float32, to nearest even (torch's cast, a GPU's)."""
    return t.to(torch.bfloat16).float()


def truncate(t: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 -> float32 toward zero: the interpreter's cast (it drops the low 16 bits)."""
    return (t.float().contiguous().view(torch.int32) & -65536).view(torch.float32)


KERNEL_ROUNDING = round_nearest if ON_GPU else truncate


class RoundedOps:
    """TorchLayerOps' arithmetic on bf16 inputs in float32, each rounding to bf16 explicit."""

    def __init__(self, rnd):
        self.rnd = rnd

    @staticmethod
    def normalised(x, eps):
        """x * rsqrt(mean(x^2) + eps) in float32: the value the norm's first rounding takes."""
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)

    def rms_norm(self, x, weight, eps):
        return self.rnd(self.rnd(self.normalised(x, eps)) * weight.float())

    def add_rms_norm(self, x, residual, weight, eps):
        summed = self.rnd(residual.float() + x.float())
        return summed, self.rms_norm(summed, weight, eps)

    def silu_mul(self, gate_up):
        gate, up = gate_up.float().chunk(2, dim=-1)
        return self.rnd(self.rnd(F.silu(gate.contiguous())) * up)

    def rope(self, x, positions, rotary):
        """A rotated float32 copy of x, as TorchLayerOps.rope_ rotates it in place."""
        out = x.float().clone()
        cos = self.rnd(rotary.cos[positions].float()).unsqueeze(1)
        sin = self.rnd(rotary.sin[positions].float()).unsqueeze(1)
        rot = out[..., : rotary.rotary_dim]
        if rotary.interleaved:
            first, second = rot[..., 0::2], rot[..., 1::2]
        else:
            half = rotary.rotary_dim // 2
            first, second = rot[..., :half], rot[..., half:]
        new_first = self.rnd(self.rnd(first * cos) - self.rnd(second * sin))
        new_second = self.rnd(self.rnd(second * cos) + self.rnd(first * sin))
        first.copy_(new_first)
        second.copy_(new_second)
        return out


def assert_rounded_alike(
    got: torch.Tensor, want: torch.Tensor, first: torch.Tensor, relative: float
) -> None:
    """bf16 results of two roundings, the first of float32 values (`first`, the reference's)
    that the kernel computes within `relative` of the reference: where no value in that
    range rounds differently, the first rounding is the same, the product after it exact
    in float32, so the results are equal; elsewhere a step apart at the first rounding,
    two at most at the second."""
    got = got.float()
    low, high = first * (1 - relative), first * (1 + relative)
    settled = KERNEL_ROUNDING(low) == KERNEL_ROUNDING(high)
    assert torch.equal(got[settled], want[settled])
    assert_within(got[~settled], want[~settled], 2 * BF16_STEP)
    assert settled.float().mean() > 0.5  # the equality above covers most elements


def assert_within(got: torch.Tensor, want: torch.Tensor, relative: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    if got.numel() == 0:
        return
    got, want = got.float(), want.float()
    bound = relative * torch.maximum(got.abs(), want.abs()) + 1e-30
    worst = ((got - want).abs() / bound).max().item()
    assert worst <= 1.0, f"off by {worst:.2f}x the bound {relative:.3g} relative"


def rotary_table(rotary_dim: int, interleaved: bool, device, positions: int = 64):
    inv_freq, scaling = rope_inv_freq(
        rotary_dim, {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                     "original_max_position_embeddings": 16}, positions,
    )  # fmt: skip
    return RotaryEmbedding(rotary_dim, positions, inv_freq, interleaved, scaling).to(device)


def norm_inputs(rows: int, width: int, dtype, device):
    x = (torch.randn(rows, width) * 3).to(dtype).to(device)
    weight = (torch.rand(width) + 0.5).to(dtype).to(device)
    return x, weight


def norm_bound(width: int) -> float:
    """float32: two sums of squares in other orders, each within (width - 1) u of the exact
    one, move rsqrt by half their difference; both rsqrts round (or err) by about a unit,
    and the two products after it round once each."""
    return (width + 8) * U32


def test_the_rounding_points_are_torchs(seed, device):
    """RoundedOps with round-to-nearest is TorchLayerOps on bf16 inputs, bit for bit."""
    x, weight = norm_inputs(3, 200, torch.bfloat16, device)
    residual = torch.randn(3, 200).bfloat16().to(device)
    gate_up = (torch.randn(4, 2 * 77) * 4).bfloat16().to(device)
    ref = RoundedOps(round_nearest)
    assert torch.equal(
        ref.rms_norm(x, weight, 1e-6), TORCH_LAYER_OPS.rms_norm(x, weight, 1e-6).float()
    )
    want_pair = TORCH_LAYER_OPS.add_rms_norm(x, residual, weight, 1e-6)
    for got, want in zip(ref.add_rms_norm(x, residual, weight, 1e-6), want_pair, strict=True):
        assert torch.equal(got, want.float())
    assert torch.equal(ref.silu_mul(gate_up), TORCH_LAYER_OPS.silu_mul(gate_up).float())
    for interleaved in (False, True):
        rotary = rotary_table(24, interleaved, device)
        q = torch.randn(5, 3, 32).bfloat16().to(device)
        positions = torch.tensor([0, 7, 63, 1, 30], device=device)
        want = q.clone()
        TORCH_LAYER_OPS.rope_(want, positions, rotary, None)
        assert torch.equal(ref.rope(q, positions, rotary), want.float())


@pytest.mark.parametrize("rows, width", [(1, 300), (5, 300), (3, 64), (2, 1500)])
def test_rms_norm_float32_against_torch(seed, device, rows, width):
    x, weight = norm_inputs(rows, width, torch.float32, device)
    assert_within(kernels.rms_norm(x, weight, 1e-5), TORCH_LAYER_OPS.rms_norm(x, weight, 1e-5),
                  norm_bound(width))  # fmt: skip


def test_rms_norm_adds_eps_where_it_matters(seed, device):
    """Rows of RMS about 1e-3 with eps 1e-6: eps is half the mean square."""
    x, weight = norm_inputs(3, 96, torch.float32, device)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt() * 1e-3
    want = TORCH_LAYER_OPS.rms_norm(x, weight, 1e-6)
    assert_within(kernels.rms_norm(x, weight, 1e-6), want, norm_bound(96))
    assert not torch.allclose(kernels.rms_norm(x, weight, 0.0), want, rtol=0.1)


@pytest.mark.parametrize("rows, width", [(1, 300), (4, 333)])
def test_rms_norm_bf16_rounds_where_torch_does(seed, device, rows, width):
    """The two bf16 roundings: normalised, then times the weight."""
    x, weight = norm_inputs(rows, width, torch.bfloat16, device)
    got = kernels.rms_norm(x, weight, 1e-6)
    assert got.dtype == torch.bfloat16
    want = RoundedOps(KERNEL_ROUNDING).rms_norm(x, weight, 1e-6)
    assert_rounded_alike(got, want, RoundedOps.normalised(x, 1e-6), norm_bound(width))


def test_rms_norm_reads_strided_rows_in_place(seed, device):
    """GLM's q/k norms take [tokens, heads, head_dim] views of the fused qkv; MLA's latent
    norm a column slice. The kernel reads them where they are."""
    qkv = torch.randn(4, 6 + 2 * 2, 48, device=device)
    weight = torch.rand(48, device=device) + 0.5
    q = qkv[:, :6]
    got = kernels.rms_norm(q, weight, 1e-6)
    assert got.shape == q.shape and got.is_contiguous()
    assert_within(got, TORCH_LAYER_OPS.rms_norm(q, weight, 1e-6), norm_bound(48))
    kv_a = torch.randn(5, 40 + 8, device=device)
    latent = kv_a[:, :40]
    weight = torch.rand(40, device=device) + 0.5
    assert_within(kernels.rms_norm(latent, weight, 1e-6),
                  TORCH_LAYER_OPS.rms_norm(latent, weight, 1e-6), norm_bound(40))  # fmt: skip
    batch = torch.randn(2, 3, 2, 40, device=device)  # more than three dims
    assert_within(kernels.rms_norm(batch, weight, 1e-6),
                  TORCH_LAYER_OPS.rms_norm(batch, weight, 1e-6), norm_bound(40))  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_writes_a_new_residual_and_leaves_the_callers(seed, device, dtype):
    x, weight = norm_inputs(3, 300, dtype, device)
    residual = torch.randn(3, 300).to(dtype).to(device)
    x_before, residual_before = x.clone(), residual.clone()
    summed, normed = kernels.rms_norm(x, weight, 1e-6, residual=residual)
    assert torch.equal(residual, residual_before) and torch.equal(x, x_before)
    assert summed.data_ptr() not in (residual.data_ptr(), x.data_ptr())
    if dtype == torch.float32:  # one float32 addition either way
        want_sum, want_norm = TORCH_LAYER_OPS.add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(summed, want_sum)
        assert_within(normed, want_norm, norm_bound(300))
    else:
        want_sum, want_norm = RoundedOps(KERNEL_ROUNDING).add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(summed.float(), want_sum)
        first = RoundedOps.normalised(want_sum, 1e-6)
        assert_rounded_alike(normed, want_norm, first, norm_bound(300))
    # The norm is of the rounded sum, not of the float32 one.
    assert torch.equal(normed, kernels.rms_norm(summed, weight, 1e-6))


# numpy's exp and torch's may differ by a unit, then an IEEE add, division and product
# round once each (the product is exact after a bf16 rounding).
SILU_BOUND = 8 * U32


@pytest.mark.parametrize("shape", [(1, 2 * 77), (6, 2 * 77), (2, 3, 2 * 40), (2, 2 * 1500)])
def test_silu_mul_float32_against_torch(seed, device, shape):
    gate_up = (torch.randn(shape) * 4).to(device)
    assert_within(kernels.silu_mul(gate_up), TORCH_LAYER_OPS.silu_mul(gate_up), SILU_BOUND)


def test_silu_mul_bf16_rounds_where_torch_does(seed, device):
    """silu(gate) rounds to bf16, then times up rounds again."""
    gate_up = (torch.randn(5, 2 * 333) * 4).bfloat16().to(device)
    got = kernels.silu_mul(gate_up)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 333)
    first = F.silu(gate_up[:, :333].float())
    assert_rounded_alike(got, RoundedOps(KERNEL_ROUNDING).silu_mul(gate_up), first, SILU_BOUND)


LAYOUTS = [(False, 32), (False, 24), (True, 32), (True, 16)]  # (interleaved, rotary_dim of 32)


@pytest.mark.parametrize("interleaved, rotary_dim", LAYOUTS)
def test_rope_float32_is_torchs_on_q_and_k_of_a_fused_qkv(seed, device, interleaved, rotary_dim):
    rotary = rotary_table(rotary_dim, interleaved, device)
    qkv = torch.randn(6, 5 + 2 * 2, 32, device=device)
    positions = torch.tensor([0, 3, 17, 63, 4, 3], device=device)
    got, want = qkv.clone(), qkv.clone()
    kernels.rope_(got[:, :7], positions, rotary.cos, rotary.sin, rotary_dim, interleaved)
    TORCH_LAYER_OPS.rope_(want[:, :7], positions, rotary, None)
    assert torch.equal(got, want)  # the same IEEE products and sums, no FMA
    assert torch.equal(got[:, 7:], qkv[:, 7:])  # v untouched
    assert torch.equal(got[..., rotary_dim:], qkv[..., rotary_dim:])  # past the rotary dims
    assert not torch.equal(got[1:, :7, :rotary_dim], qkv[1:, :7, :rotary_dim])


@pytest.mark.parametrize("interleaved, rotary_dim", LAYOUTS)
def test_rope_bf16_rounds_where_torch_does(seed, device, interleaved, rotary_dim):
    """Tables, four products and two sums each rounded to bf16: exact against RoundedOps."""
    rotary = rotary_table(rotary_dim, interleaved, device)
    x = torch.randn(5, 3, 32).bfloat16().to(device)
    positions = torch.tensor([1, 0, 63, 9, 40], dtype=torch.int32, device=device)
    want = RoundedOps(KERNEL_ROUNDING).rope(x, positions.long(), rotary)
    kernels.rope_(x, positions, rotary.cos, rotary.sin, rotary_dim, interleaved)
    assert torch.equal(x.float(), want)


def test_rope_on_mla_slices_of_each_head(seed, device):
    """MLA rotates q_rope, the last dims of each head (a strided slice), and the one rope key."""
    rotary = rotary_table(16, True, device)
    q = torch.randn(3, 4, 24 + 16, device=device)
    kv_a = torch.randn(3, 40 + 16, device=device)
    positions = torch.tensor([5, 6, 7], device=device)
    got_q, want_q, got_kv, want_kv = q.clone(), q.clone(), kv_a.clone(), kv_a.clone()
    kernels.rope_(got_q[..., 24:], positions, rotary.cos, rotary.sin, 16, True)
    kernels.rope_(got_kv[:, 40:].unsqueeze(1), positions, rotary.cos, rotary.sin, 16, True)
    TORCH_LAYER_OPS.rope_(want_q[..., 24:], positions, rotary, None)
    TORCH_LAYER_OPS.rope_(want_kv[:, 40:].unsqueeze(1), positions, rotary, None)
    assert torch.equal(got_q, want_q) and torch.equal(got_kv, want_kv)


def test_rope_leaves_a_token_outside_the_table_as_it_is(device):
    rotary = rotary_table(16, False, device, positions=8)
    x = torch.randn(3, 2, 16, device=device)
    got = x.clone()
    kernels.rope_(got, torch.tensor([2, 8, -1], device=device), rotary.cos, rotary.sin, 16, False)
    assert torch.equal(got[1:], x[1:]) and not torch.equal(got[0], x[0])


def test_empty_inputs_launch_nothing(device):
    x = torch.empty(0, 64, device=device)
    weight = torch.ones(64, device=device)
    assert kernels.rms_norm(x, weight, 1e-6).shape == (0, 64)
    assert kernels.silu_mul(torch.empty(0, 128, device=device)).shape == (0, 64)
    rotary = rotary_table(16, False, device)
    kernels.rope_(torch.empty(0, 2, 16, device=device), torch.empty(0, dtype=torch.long,
                  device=device), rotary.cos, rotary.sin, 16, False)  # fmt: skip


def test_bad_inputs_are_refused_with_the_reason(device):
    x = torch.randn(2, 64, device=device)
    with pytest.raises(ValueError, match=r"weight must be \[64\]"):
        kernels.rms_norm(x, torch.ones(32, device=device), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        kernels.rms_norm(x, torch.ones(64, device=device), 1e-6, residual=x[:1])
    with pytest.raises(ValueError, match="dtype torch.float64"):
        kernels.rms_norm(x.double(), torch.ones(64, device=device).double(), 1e-6)
    with pytest.raises(ValueError, match="unit stride"):
        kernels.silu_mul(torch.randn(64, 2, device=device).t())
    with pytest.raises(ValueError, match="must be even"):
        kernels.silu_mul(torch.randn(2, 63, device=device))
    rotary = rotary_table(16, False, device)
    q = torch.randn(3, 2, 16, device=device)
    with pytest.raises(ValueError, match="within head_dim"):
        kernels.rope_(q[..., :8], torch.arange(3, device=device), rotary.cos, rotary.sin, 16,
                      False)  # fmt: skip
    with pytest.raises(ValueError, match="positions must be"):
        kernels.rope_(q, torch.arange(2, device=device), rotary.cos, rotary.sin, 16, False)
    with pytest.raises(ValueError, match="positions is on meta"):
        kernels.rope_(q, torch.arange(3, device="meta"), rotary.cos, rotary.sin, 16, False)
