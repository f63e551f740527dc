"""YaRN rotary scaling as DeepSeek V3 and Kimi K2 use it.

YaRN stretches the long-wavelength rotary frequencies by `factor` (so positions
beyond the pretraining length look familiar), keeps the short-wavelength ones
as they were, and blends linearly in between. The blend band is given in
"rotations over the original context": dimensions that turn more than
`beta_fast` times keep their frequency, fewer than `beta_slow` times get the
interpolated one.

Two temperature corrections come with it ("mscale"):
- `attention_factor` multiplies cos and sin, so it scales q·k twice over the
  rope dims: mscale(factor, mscale) / mscale(factor, mscale_all_dim);
- DeepSeek additionally multiplies the softmax scale by
  mscale(factor, mscale_all_dim)**2, which covers every dim of q·k. With
  Kimi's mscale == mscale_all_dim == 1 the first is 1 and only this one acts.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.errors import CheckpointError


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """The attention temperature YaRN prescribes for a context stretched by `factor`."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def _correction_dim(rotations: float, dim: int, base: float, original_len: int) -> float:
    """The (fractional) rotary dim index whose wavelength fits `rotations` times in the context."""
    return dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn_factor(rope: dict[str, Any], max_positions: int | None) -> float:
    factor = rope.get("factor")
    if factor is None:
        # DeepSeek-style configs may leave it implicit: the stretch is whatever
        # takes the original context to the advertised one.
        original = rope.get("original_max_position_embeddings")
        if not original or not max_positions:
            raise CheckpointError("yarn rope scaling needs 'factor' in rope_scaling")
        factor = max_positions / original
    return float(factor)


def yarn_inv_freq(
    rotary_dim: int, rope: dict[str, Any], max_positions: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies for the rotary dims and the cos/sin multiplier (attention_factor)."""
    if "original_max_position_embeddings" not in rope:
        raise CheckpointError("yarn rope scaling needs 'original_max_position_embeddings'")
    base = float(rope.get("rope_theta", 10000.0))
    factor = _yarn_factor(rope, max_positions)
    original_len = int(rope["original_max_position_embeddings"])
    beta_fast = float(rope.get("beta_fast") or 32.0)
    beta_slow = float(rope.get("beta_slow") or 1.0)

    wavelength_base = base ** (
        torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    )
    extrapolated = 1.0 / wavelength_base
    interpolated = 1.0 / (factor * wavelength_base)

    low = _correction_dim(beta_fast, rotary_dim, base, original_len)
    high = _correction_dim(beta_slow, rotary_dim, base, original_len)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a zero-width band would divide by zero
    # 0 below the band (keep the original frequency), 1 above it (interpolate).
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    inv_freq = interpolated * ramp + extrapolated * (1 - ramp)

    attention_factor = rope.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    return inv_freq, float(attention_factor)


def softmax_scale_multiplier(rope: dict[str, Any], max_positions: int | None = None) -> float:
    """DeepSeek's extra softmax-scale factor: mscale(factor, mscale_all_dim)**2, else 1."""
    if rope.get("rope_type", "default") == "default":
        return 1.0
    mscale_all_dim = rope.get("mscale_all_dim") or 0
    if not mscale_all_dim:
        return 1.0
    multiplier = yarn_mscale(_yarn_factor(rope, max_positions), float(mscale_all_dim))
    return multiplier * multiplier
