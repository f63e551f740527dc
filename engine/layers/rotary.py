"""Rotary position embeddings: NeoX (half rotation) and interleaved styles, partial dims.

Styles differ between model families (DESIGN.md §5): Llama and GLM-MoE rotate
the two halves of the rotary dims (NeoX); GLM-4 dense and Kimi rotate adjacent
pairs (interleaved). Only the first `rotary_dim` dims of each head rotate.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.layers.layer_ops import TORCH_LAYER_OPS
from engine.layers.yarn import yarn_inv_freq


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


def rope_inv_freq(
    rotary_dim: int, rope: dict[str, Any], max_positions: int | None = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin multiplier for a normalised rope dict.

    `max_positions` only matters for YaRN configs that leave `factor` implicit.
    """
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
    if rope_type == "yarn":
        return yarn_inv_freq(rotary_dim, rope, max_positions)
    raise UnsupportedModelError(
        f"rope_type {rope_type!r} is not supported for this model; "
        "supported: default, linear, llama3, yarn"
    )


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings in place to [tokens, heads, head_dim] tensors.

    Every layer has an identical table; the rows for a step's positions are
    looked up once per step (in the step's cache) and reused by all layers.
    The rotation itself is the layer ops' (engine/layers/layer_ops.py): torch by
    default, the C kernel once the engine chooses it.
    """

    ops = TORCH_LAYER_OPS

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
        self.signature = (
            rotary_dim,
            max_positions,
            interleaved,
            attention_scaling,
            tuple(inv_freq.tolist()),
        )

    def restyled(self, interleaved: bool) -> RotaryEmbedding:
        """The same frequencies on the same tables, pairing dims in the other style (DSA's
        indexer rotates half-split where DeepSeek V3.2's attention interleaves)."""
        other = copy.copy(self)  # shares the cos/sin buffers: they are tens of MB
        other.interleaved = interleaved
        other.signature = (*self.signature[:2], interleaved, *self.signature[3:])
        return other

    def tables(self, positions: torch.Tensor, dtype: torch.dtype, step_cache: dict | None):
        """cos/sin for these positions in the activations' dtype, as transformers computes them."""
        key = ("rotary", self.signature, dtype)
        if step_cache is not None and key in step_cache:
            return step_cache[key]
        tables = (
            self.cos[positions].to(dtype).unsqueeze(1),
            self.sin[positions].to(dtype).unsqueeze(1),
        )
        if step_cache is not None:
            step_cache[key] = tables
        return tables

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, step_cache: dict | None = None
    ) -> None:
        """Rotate x [tokens, heads, head_dim] in place (q and k may be passed together)."""
        self.ops.rope_(x, positions, self, step_cache)


def model_rotary(cfg, interleaved: bool, default_partial: float = 1.0) -> RotaryEmbedding:
    """One rotary table for all of a model's layers (tables for 128k+ positions are
    tens of MB each). `cfg` is a ModelConfig; `default_partial` applies when the
    config names no partial_rotary_factor."""
    rotary_dim = int(cfg.head_dim * float(cfg.rope.get("partial_rotary_factor", default_partial)))
    max_positions = cfg.max_position_embeddings
    inv_freq, scaling = rope_inv_freq(rotary_dim, cfg.rope, max_positions)
    return RotaryEmbedding(rotary_dim, max_positions, inv_freq, interleaved, scaling)
