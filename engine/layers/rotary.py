"""Rotary position embeddings: NeoX (half rotation) and interleaved styles, partial dims.

Styles differ between model families (DESIGN.md §5): Llama and GLM-MoE rotate
the two halves of the rotary dims (NeoX); GLM-4 dense and Kimi rotate adjacent
pairs (interleaved). Only the first `rotary_dim` dims of each head rotate.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from engine.errors import UnsupportedModelError


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths divided by `factor`, a smooth band between."""
    factor = rope["factor"]
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_len = rope["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_inv_freq(rotary_dim: int, rope: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin multiplier for a normalised rope dict."""
    base = float(rope.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (
        base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)
    )
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(rope["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope), 1.0
    raise UnsupportedModelError(
        f"rope_type {rope_type!r} is not supported for this model; "
        "supported: default, linear, llama3"
    )


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to q and k of shape [tokens, heads, head_dim] in place."""

    def __init__(
        self,
        rotary_dim: int,
        max_positions: int,
        inv_freq: torch.Tensor,
        interleaved: bool = False,
        attention_scaling: float = 1.0,
    ):
        super().__init__()
        self.rotary_dim = rotary_dim
        self.interleaved = interleaved
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq.float())
        self.register_buffer("cos", freqs.cos() * attention_scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * attention_scaling, persistent=False)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        rot = x[..., : self.rotary_dim]
        if self.interleaved:
            first, second = rot[..., 0::2], rot[..., 1::2]
        else:
            half = self.rotary_dim // 2
            first, second = rot[..., :half], rot[..., half:]
        new_first = first * cos - second * sin
        new_second = second * cos + first * sin
        first.copy_(new_first)
        second.copy_(new_second)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        # cos/sin in the activations' dtype, as transformers computes them.
        cos = self.cos[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin[positions].to(q.dtype).unsqueeze(1)
        self._rotate(q, cos, sin)
        self._rotate(k, cos, sin)
