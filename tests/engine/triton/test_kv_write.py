"""The KV write kernel: slots, saturation, scales, padding, against the pools' torch writes.

Under TRITON_INTERPRET=1 Triton's float->fp8 cast drops the carry when
rounding up crosses a power of two (7.87 -> 4.0 instead of 8.0) and its
float32->bf16 cast truncates, so on CPU the exact comparisons use inputs
that need no rounding: values that are e4m3 (or bf16) numbers times
power-of-two scales, plus out-of-range values that must saturate to ±448.
Bit-exact comparison on arbitrary inputs runs on a GPU only.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.triton.kv_write import write_gqa, write_mla  # noqa: E402
from engine.kv.mla_pool import MLALatentPool, MLALayout  # noqa: E402
from engine.kv.pool import PagedKVPool  # noqa: E402
from engine.kv.quant import FP8_MAX, quantize_fp8  # noqa: E402
from engine.kv.sizing import KVLayout  # noqa: E402
from tests.engine.triton.cases import e4m3_values, pow2_scales  # noqa: E402

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="the interpreter's float->fp8/bf16 casts round wrongly (DESIGN.md §3); GPU only",
)
POISON = 0xA5  # storage bytes that no write in these tests produces


def gqa_storage(slots: int, kv_heads: int, head_dim: int, dtype, device) -> torch.Tensor:
    storage = torch.empty(slots, 2, kv_heads, head_dim, dtype=dtype, device=device)
    storage.view(torch.uint8).fill_(POISON)
    return storage


def saturating_inputs(shape, scales: torch.Tensor, device) -> torch.Tensor:
    """e4m3 values times per-head scales, with some far beyond ±448·scale (incl. ±inf)."""
    x = e4m3_values(shape) * scales.view(-1, 1)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel())[: max(4, flat.numel() // 8)]
    flat[picks] = torch.tensor([1.0, -1.0]).repeat(picks.numel())[: picks.numel()] * 1e4
    flat[picks[:2]] = torch.tensor([float("inf"), float("-inf")])
    return x.to(device)


def test_fp8_write_saturates_and_uses_per_head_scales(seed, device):
    tokens, kv_heads, head_dim = 7, 4, 16
    k_scales, v_scales = pow2_scales(kv_heads), pow2_scales(kv_heads)
    k = saturating_inputs((tokens, kv_heads, head_dim), k_scales, device)
    v = saturating_inputs((tokens, kv_heads, head_dim), v_scales, device)
    slots = torch.tensor([3, 11, -1, 0, 29, 12, 5], device=device)  # -1: padding
    storage = gqa_storage(32, kv_heads, head_dim, torch.uint8, device)
    write_gqa(storage, slots, k, v, k_scales.to(device), v_scales.to(device))

    real = slots >= 0
    expected_k = quantize_fp8(k, k_scales.view(-1, 1).to(device)).view(torch.uint8)
    expected_v = quantize_fp8(v, v_scales.view(-1, 1).to(device)).view(torch.uint8)
    assert torch.equal(storage[slots[real], 0], expected_k[real])
    assert torch.equal(storage[slots[real], 1], expected_v[real])
    decoded = storage[slots[real]].view(torch.float8_e4m3fn).float()
    assert decoded.isfinite().all() and decoded.abs().max() == FP8_MAX  # saturated, no NaN
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[slots[real].cpu()] = False
    assert (storage[untouched.to(device)] == POISON).all()  # padding and other slots unwritten


def test_bf16_write_is_exact_and_skips_padding(seed, device):
    tokens, kv_heads, head_dim = 9, 2, 32
    fused = torch.randn(tokens, 3, kv_heads, head_dim).bfloat16().to(device)
    k, v = fused[:, 1], fused[:, 2]  # strided views, as a fused QKV projection gives them
    slots = torch.tensor([0, 1, 2, 3, -1, 17, 18, 31, 16], device=device)
    storage = gqa_storage(32, kv_heads, head_dim, torch.bfloat16, device)
    write_gqa(storage, slots, k, v, None, None)
    real = slots >= 0
    assert torch.equal(storage[slots[real], 0], k[real])
    assert torch.equal(storage[slots[real], 1], v[real])
    assert (storage.view(torch.uint8)[4:16] == POISON).all()


def test_write_matches_the_gqa_pool(seed, device):
    """Same bytes as PagedKVPool.write for values the interpreter casts exactly."""
    layout = KVLayout(num_layers=2, kind="gqa", num_kv_heads=2, head_dim=16)
    pool = PagedKVPool(layout, 4, 4, "fp8_e4m3", device)
    pool.set_scales(pow2_scales(2), pow2_scales(2), "test")
    k_scales, v_scales = pool.layer_scales(1)
    k = e4m3_values((6, 2, 16)).to(device) * k_scales.view(-1, 1)
    v = e4m3_values((6, 2, 16)).to(device) * v_scales.view(-1, 1)
    slots = torch.tensor([15, 2, 7, 8, 0, 9], device=device)
    pool.storage.zero_()
    pool.write(1, k, v, slots)
    expected = pool.storage[1].clone()
    pool.storage.zero_()
    write_gqa(pool.storage[1], slots, k, v, k_scales, v_scales)
    assert torch.equal(pool.storage[1], expected)
    assert not pool.storage[0].any()  # the other layer is untouched


def test_mla_write_matches_the_latent_pool(seed, device):
    layout = MLALayout(num_layers=2, kind="mla", latent_dim=40, rope_dim=8)
    pool = MLALatentPool(layout, 4, 4, "fp8_e4m3", device)
    latent_scale, rope_scale = pow2_scales(2), pow2_scales(2)
    pool.set_scales(latent_scale, rope_scale, "test")
    latent = saturating_inputs((5, 1, 32), latent_scale[1:2], device).view(5, 32)
    rope = saturating_inputs((5, 1, 8), rope_scale[1:2], device).view(5, 8)
    slots = torch.tensor([4, 0, 13, 6, 15], device=device)
    pool.storage.zero_()
    pool.write(1, latent, rope, slots)
    expected = pool.storage[1].clone()
    pool.storage.zero_()
    scales = torch.stack([latent_scale[1], rope_scale[1]]).to(device)
    write_mla(pool.storage[1], slots, latent, rope, scales)
    assert torch.equal(pool.storage[1], expected)


@needs_gpu
def test_fp8_write_is_bit_exact_with_torch_on_random_values(seed):
    """Any value rounds as torch's cast does: the GPU's e4m3 conversion is round-to-nearest-even."""
    device = torch.device("cuda")
    tokens, kv_heads, head_dim = 4096, 8, 128
    k_scales = torch.rand(kv_heads, device=device) * 0.05 + 1e-3
    v_scales = torch.rand(kv_heads, device=device) * 0.05 + 1e-3
    k = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16) * 3
    v = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16) * 3
    slots = torch.randperm(tokens, device=device)
    storage = gqa_storage(tokens, kv_heads, head_dim, torch.uint8, device)
    write_gqa(storage, slots, k, v, k_scales, v_scales)
    assert torch.equal(storage[slots, 0], quantize_fp8(k, k_scales.view(-1, 1)).view(torch.uint8))
    assert torch.equal(storage[slots, 1], quantize_fp8(v, v_scales.view(-1, 1)).view(torch.uint8))


@needs_gpu
def test_float32_to_bf16_write_rounds_like_torch(seed):
    device = torch.device("cuda")
    k, v = torch.randn(2, 300, 2, 64, device=device)
    slots = torch.arange(300, device=device)
    storage = gqa_storage(300, 2, 64, torch.bfloat16, device)
    write_gqa(storage, slots, k, v, None, None)
    assert torch.equal(storage[:, 0], k.bfloat16()) and torch.equal(storage[:, 1], v.bfloat16())
