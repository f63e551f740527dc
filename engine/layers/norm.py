"""RMSNorm with the same arithmetic as transformers: normalise in float32, scale in the input dtype."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.layer_ops import TORCH_LAYER_OPS


class RMSNorm(nn.Module):
    # The arithmetic: torch by default, the C kernels once the engine chooses them
    # (engine/layers/layer_ops.py).
    ops = TORCH_LAYER_OPS

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)
