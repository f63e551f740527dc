"""The fused MoE against a token-by-token torch reference on dequantized experts.

Shapes: 5 tokens, top-2 of 8 experts, H = 160 and I = 96 (neither a multiple
of the tiles nor of FP8's 128 blocks; I/8 and I/32 INT4 words and groups
are whole, H has a partial FP8 block). Routing: token 3 uses token 1's
experts in the other order, expert 5 receives nothing.

Tolerances (relative to max|ref|, the output's scale):
- float32, dense and INT4: the reference and the kernel compute the same
  products in different summation orders; the worst-case bound of
  K * 2**-24 * sum|terms| over two chained products with K <= 160 and
  SiLU's slope <= 1.1 stays below 1e-4 of max|ref| for these O(1) inputs,
  hence 1e-4 (observed: about 1e-7).
- FP8 stages alone (gate/up, then down fed the kernel's own intermediate):
  the same 1e-4, plus on a GPU Hopper's ~14-bit FP8 accumulation within one
  128-wide tile (2**-13 of the magnitudes, DeepSeek-V3 report §3.3.2), plus
  for a bf16 intermediate its rounding (2**-7 of each element).
- FP8 end to end in float32: the intermediate is re-quantized to e4m3, and a
  value that fp32 summation order moves across an e4m3 rounding midpoint
  changes by one e4m3 step (up to 2**-3 relative) in its down product;
  2e-2 of max|ref| allows a few such flips. Errors from a wrong scale, expert
  or token are of the order of max|ref| itself. With a bf16 intermediate the
  interpreter's truncating cast moves about half the values by one bf16 ulp
  before they are quantized, so flips are common there: FP8 in bf16 is
  checked stage by stage (and fused_moe equal to the stages), not end to end.
- bf16: the output's rounding (2**-7 of |ref|: the interpreter truncates)
  plus the bf16 intermediate, which may round one ulp apart (2**-7 of each
  element) and enters a down product of I random-sign terms: 2**-6 of
  max|ref| covers it; on a GPU INT4 weights are also rounded to bf16
  (2**-9 each), well inside the same bound.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.gpu_kernels.fp8_act_quant import quantize_activations_reference  # noqa: E402
from engine.gpu_kernels.fused_moe import (  # noqa: E402
    DenseExperts,
    Fp8BlockExperts,
    Int4Experts,
    fused_moe,
    moe_align,
    moe_down,
    moe_gate_up,
)
from tests.engine.gpu_kernels.references import (  # noqa: E402
    BF16_ULP,
    assert_within,
    dequantize_activations,
    make_experts,
    moe_reference,
)

T, TOP_K, E, H, INTER = 5, 2, 8, 160, 96
EMPTY_EXPERT = 5


def routing(device, tokens=T, top_k=TOP_K, experts=E):
    choices = [e for e in range(experts) if e != EMPTY_EXPERT]
    ids = torch.stack([torch.tensor(choices)[torch.randperm(len(choices))[:top_k]]
                       for _ in range(tokens)])  # fmt: skip
    if tokens > 3:
        ids[3] = ids[1].flip(0)  # the same expert set as token 1, in the other slots
    weights = torch.rand(tokens, top_k)
    weights = weights / weights.sum(dim=1, keepdim=True)
    return ids.to(device), weights.to(device)


def fp8_act(x: torch.Tensor) -> torch.Tensor:
    q, s = quantize_activations_reference(x)
    return dequantize_activations(q, s, 128)


def fp8_gpu_slack(device) -> float:
    return 2.0**-13 * 8 if device.type == "cuda" else 0.0  # magnitudes ~8x max|ref| here


@pytest.mark.parametrize("kind", ["dense", "int4", "fp8"])
def test_float32_matches_reference(seed, device, kind):
    experts, w13, w2 = make_experts(kind, E, H, INTER, torch.float32, device)
    x = torch.randn(T, H, device=device)
    ids, weights = routing(device)
    out = fused_moe(x, ids, weights, experts)
    assert out.shape == (T, H) and out.dtype == torch.float32
    ref, _ = moe_reference(x, ids, weights, w13, w2, torch.float32,
                           fp8_act if kind == "fp8" else None)  # fmt: skip
    scale = ref.abs().max()
    tol = (2e-2 if kind == "fp8" else 1e-4 + fp8_gpu_slack(device)) * scale
    assert_within(out, ref, tol, f"fused moe {kind} float32")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_stages_match_reference_tightly(seed, device, dtype):
    """Gate/up against the reference's intermediate; down fed the kernel's own intermediate;
    fused_moe is exactly the two stages and the per-token sum."""
    experts, w13, w2 = make_experts("fp8", E, H, INTER, dtype, device)
    x = torch.randn(T, H, device=device).to(dtype)
    ids, weights = routing(device)
    blocks = moe_align(ids, E, 16)
    inter = moe_gate_up(x, blocks, experts)
    assert inter.dtype == dtype
    _, ref_inter = moe_reference(x, ids, weights, w13, w2, dtype, fp8_act)
    tol = (1e-4 + fp8_gpu_slack(device)) * ref_inter.abs().max()
    if dtype == torch.bfloat16:
        tol = tol + BF16_ULP * ref_inter.abs()  # the kernel's own bf16 rounding of the result
    assert_within(inter, ref_inter, tol, "fp8 gate/up")

    pairs = moe_down(inter, blocks, experts, weights)
    a = fp8_act(inter.float().cpu())  # what the kernel's down stage reads, dequantized
    flat_ids, flat_w = ids.reshape(-1).cpu(), weights.reshape(-1).cpu()
    ref_pairs = torch.stack([flat_w[p] * (a[p] @ w2[flat_ids[p]].T) for p in range(T * TOP_K)])
    tol = (1e-4 + fp8_gpu_slack(device)) * ref_pairs.abs().max()
    assert_within(pairs, ref_pairs, tol, "fp8 down")

    out = fused_moe(x, ids, weights, experts)
    assert torch.equal(out, pairs.view(T, TOP_K, H).sum(dim=1).to(dtype))


@pytest.mark.parametrize("kind", ["dense", "int4"])
def test_bf16_matches_reference(seed, device, kind):
    experts, w13, w2 = make_experts(kind, E, H, INTER, torch.bfloat16, device)
    x = torch.randn(T, H, device=device).bfloat16()
    ids, weights = routing(device)
    out = fused_moe(x, ids, weights, experts)
    assert out.dtype == torch.bfloat16
    ref, _ = moe_reference(x, ids, weights, w13, w2, torch.bfloat16)
    tol = BF16_ULP * ref.abs() + 2.0**-6 * ref.abs().max()
    assert_within(out, ref, tol, f"fused moe {kind} bf16")


def test_experts_with_several_blocks_and_dropped_slots(seed, device):
    """20 tokens on 2 of 4 experts: 20 pairs each, two 16-row blocks; id -1 drops a slot."""
    h, i, e = 64, 32, 4
    experts, w13, w2 = make_experts("dense", e, h, i, torch.float32, device)
    x = torch.randn(20, h, device=device)
    ids = torch.tensor([[0, 1], [1, 0]] * 10, device=device)
    ids[4, 1] = -1
    weights = torch.rand(20, 2, device=device)
    out = fused_moe(x, ids, weights, experts)
    ref, _ = moe_reference(x, ids, weights, w13, w2, torch.float32)
    assert_within(out, ref, 1e-4 * ref.abs().max(), "fused moe, several blocks per expert")


def test_preallocated_output_and_empty_batch(seed, device):
    experts, _, _ = make_experts("dense", 4, 64, 32, torch.float32, device)
    out = torch.full((3, 64), float("nan"), device=device)
    ids, weights = routing(device, tokens=3, experts=4)
    x = torch.randn(3, 64, device=device)
    assert fused_moe(x, ids, weights, experts, out=out) is out and not out.isnan().any()
    empty = fused_moe(x[:0], ids[:0], weights[:0], experts)
    assert empty.shape == (0, 64)


def test_rejects_bad_inputs(device):
    dense, _, _ = make_experts("dense", 4, 64, 32, torch.float32, device)
    fp8, _, _ = make_experts("fp8", 4, 64, 32, torch.float32, device)
    int4, _, _ = make_experts("int4", 4, 64, 32, torch.float32, device)
    x = torch.randn(3, 64, device=device)
    ids, weights = routing(device, tokens=3, experts=4)
    bad_int4_scale = Int4Experts(int4.w13_packed, int4.w13_scale[:, :, :1], int4.w2_packed,
                                 int4.w2_scale, 32)  # fmt: skip
    cases = [
        (x[None], ids, weights, dense, "hidden must be 2-D"),
        (x, ids.float(), weights, dense, "topk_ids has dtype"),
        (x, ids, weights[:, :1], dense, "must both be"),
        (x, ids[:2], weights[:2], dense, "must both be"),
        (x.bfloat16(), ids, weights, dense, "w13 has dtype torch.float32, the activations"),
        (x, ids, weights, DenseExperts(dense.w13, dense.w2[:, :, :16]), "w2 has shape"),
        (x, ids, weights, DenseExperts(dense.w13[:, :63], dense.w2), "even count"),
        (x[:, :32], ids, weights, dense, r"w13 has shape .*\[E, 2I, H\]"),
        (x, ids, weights, Fp8BlockExperts(fp8.w13.view(torch.uint8), fp8.w13_scale_inv, fp8.w2,
                                          fp8.w2_scale_inv), "w13 has dtype torch.uint8"),
        (x, ids, weights, Fp8BlockExperts(fp8.w13, fp8.w13_scale_inv[:, :1], fp8.w2,
                                          fp8.w2_scale_inv), "w13_scale_inv has shape"),
        (x, ids, weights, Int4Experts(int4.w13_packed.long(), int4.w13_scale, int4.w2_packed,
                                      int4.w2_scale, 32), "w13_packed has dtype torch.int64"),
        (x, ids, weights, bad_int4_scale, "w13_scale has shape"),
        (x, ids, weights, Int4Experts(int4.w13_packed, int4.w13_scale, int4.w2_packed,
                                      int4.w2_scale, 40), "w13_packed has shape"),
    ]  # fmt: skip
    for hidden, topk_ids, topk_weights, experts, message in cases:
        with pytest.raises(ValueError, match=message):
            fused_moe(hidden, topk_ids, topk_weights, experts)
