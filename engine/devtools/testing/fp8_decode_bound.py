"""The error bound of decode on FP8 tensor cores, for tests and bench/gpu_check.py.

With FP8 pages the decode kernels multiply e4m3 operands (decode_fp8.py for
GQA, mla_decode.py's FP8_DOT for MLA): each head's query is quantized with
its own scale (largest magnitude -> 448; MLA's latent and rope parts each
their own), and the softmax weights, times P_FP8_SCALE, are rounded to e4m3
for the PV dot. The references here reproduce the query quantization exactly
(torch's cast, which `round_to_e4m3` computes bit for bit) and keep the
weights exact, so what is left is the weights' rounding: each weight P_j
within 2^-4 of itself (half a step of a 3-bit mantissa), or, in e4m3's
subnormal range, within 2^-10 / P_FP8_SCALE = 2^-18 (and never more than
itself). Per output element

    |out - ref| <= v_scale * sum_j max(2^-4 P_j, min(P_j, 2^-18)) |v_j|

plus fp32 slack, whatever the split layout: each split rounds its weights
against its own running maximum, which is at most the global one, so a
weight's absolute floor only shrinks in global units; the merge is a convex
combination of the splits. A kernel that dropped a query scale or left the
weights P_FP8_SCALE times too large misses the bound by orders of magnitude.
"""

from __future__ import annotations

import torch

from engine.attention.triton.common import P_FP8_SCALE
from engine.kv.quant import FP8_MAX

E4M3_HALF_STEP = 2.0**-4  # relative rounding of a normal e4m3 value
SUBNORMAL_WEIGHT_ERROR = 2.0**-10 / P_FP8_SCALE  # half of e4m3's 2^-9 step, in weight units
# fp32 rounding of the scores (summed and scaled in fp32, then exponentiated), the merge
# and the scales, relative to sum_j P_j |v_j|; and an absolute floor.
FP32_SLACK = 1e-4
ABSOLUTE_SLACK = 1e-6
# An output rounded to bf16: within one step (8 significant bits) of the value, not half
# of one, since the interpreter's float -> bf16 cast truncates (DESIGN.md §3).
BF16_OUTPUT_ROUNDING = 2.0**-7


def quantized_queries(q: torch.Tensor) -> torch.Tensor:
    """Head rows [..., D] as the kernels multiply them, in float64: e4m3 values times
    the row's float32 scale (largest magnitude -> 448; an all-zero row keeps scale 1)."""
    x = q.float()
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q8 = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q8.double() * scale.double()


def _weights_and_bound(scores: torch.Tensor, values: torch.Tensor, v_scale) -> tuple:
    """softmax(scores) [H, L] applied to values [L, H, D] (or [L, D], shared by the heads)
    -> (output, bound) [H, D], both times v_scale ([H, 1] or a float)."""
    weights = torch.softmax(scores, dim=-1)
    per_weight = torch.maximum(
        E4M3_HALF_STEP * weights, torch.clamp(weights, max=SUBNORMAL_WEIGHT_ERROR)
    )
    pattern = "hl,lhd->hd" if values.dim() == 3 else "hl,ld->hd"
    out = torch.einsum(pattern, weights, values) * v_scale
    magnitude = torch.einsum(pattern, weights, values.abs()) * v_scale
    bound = torch.einsum(pattern, per_weight, values.abs()) * v_scale
    return out, bound + FP32_SLACK * magnitude + ABSOLUTE_SLACK


def gqa_reference_and_bound(
    q: torch.Tensor,  # [Hq, D] one sequence's decode query
    stored: torch.Tensor,  # [L, 2, Hkv, D] its stored K/V bytes (uint8 e4m3)
    k_scales: torch.Tensor,  # [Hkv]
    v_scales: torch.Tensor,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 attention with the kernel's quantized queries, the error bound), [Hq, D]."""
    values8 = stored.cpu().view(torch.float8_e4m3fn).double()
    group = q.shape[0] // stored.shape[2]
    keys = (values8[:, 0] * k_scales.cpu().view(1, -1, 1).double()).repeat_interleave(group, 1)
    values = values8[:, 1].repeat_interleave(group, 1)  # before the V scale
    v_scale = v_scales.cpu().double().repeat_interleave(group).view(-1, 1)
    scores = torch.einsum("hd,lhd->hl", quantized_queries(q.cpu()), keys) * softmax_scale
    return _weights_and_bound(scores, values, v_scale)


def mla_reference_and_bound(
    q: torch.Tensor,  # [H, lora + rope] one sequence's absorbed query
    stored: torch.Tensor,  # [L, lora + rope] its stored latent rows (uint8 e4m3)
    lora: int,
    latent_scale: float,
    rope_scale: float,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 latent-space output, the error bound), [H, lora]: the latent and rope
    parts of each head's query quantized with their own scales, as the kernel does."""
    rows = stored.cpu().view(torch.float8_e4m3fn).double()
    latent, rope = rows[:, :lora], rows[:, lora:]
    q = q.cpu()
    q_c, q_r = quantized_queries(q[:, :lora]), quantized_queries(q[:, lora:])
    scores = (latent_scale * q_c @ latent.T + rope_scale * q_r @ rope.T) * softmax_scale
    return _weights_and_bound(scores, latent, latent_scale)


def excess_over_bound(
    out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor, rounding: float = 0.0
) -> float:
    """The largest amount by which |out - ref| exceeds the bound (plus `rounding` relative,
    BF16_OUTPUT_ROUNDING for bf16 outputs); <= 0 means within it."""
    ref = ref.double().cpu()
    error = (out.double().cpu() - ref).abs()
    return (error - (bound.cpu() + rounding * ref.abs())).max().item()
