"""Gated activations for fused gate/up projections."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused [gate | up] tensor: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    # A strided view and a contiguous tensor take different vectorised paths
    # through silu's exp, which round differently: keep every row's input
    # layout the same however many rows there are (deterministic mode).
    return F.silu(gate.contiguous()) * up
