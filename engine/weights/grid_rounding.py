"""Dense weights rounded onto llama.cpp's Q8_0, Q4_0 and Q4_1 grids, as its quantizers do.

Per group of 32 values along a row (IEEE-half steps, as the blocks store them):
- Q8_0: d = amax / 127, q = round(x / d) in -127..127, value d * q;
- Q4_0: d = v / -8 for v the value of largest magnitude, q = min(15, floor(x / d + 8.5)),
  value d * (q - 8);
- Q4_1: d = (max - min) / 15, m = min, q = min(15, floor((x - m) / d + 0.5)),
  value d * q + m.
Each chooses q with the unrounded step, then stores d (and m) in half.

The results are float32 values that lie exactly on the grid, so the CPU grid
packer (engine/layers/cpu_grid_weights.py) keeps them packed without loss.
Used to quantize a dense checkpoint at load (`--cpu-weights`) and to make the
benchmarks' random checkpoints (engine/devtools/testing/realistic_checkpoints.py).
"""

from __future__ import annotations

import torch

GROUP = 32


def _groups(weight: torch.Tensor) -> torch.Tensor:
    return weight.float().reshape(weight.shape[0], -1, GROUP)


def q8_0_values(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] rounded onto the Q8_0 grid."""
    groups = _groups(weight)
    d = groups.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = (groups * inv).round_().clamp_(-127, 127)
    return (q * d.half().float()).reshape(weight.shape)


def q4_0_values(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] rounded onto the Q4_0 grid."""
    groups = _groups(weight)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    extreme = torch.where(hi.abs() > lo.abs(), hi, lo)
    d = extreme / -8
    inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = (groups * inv + 8.5).floor_().clamp_(0, 15)
    return (d.half().float() * (q - 8)).reshape(weight.shape)


def q4_1_values(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [N, K] rounded onto the Q4_1 grid."""
    groups = _groups(weight)
    lo = groups.amin(-1, keepdim=True)
    hi = groups.amax(-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = ((groups - lo) * inv + 0.5).floor_().clamp_(0, 15)
    return (q * d.half().float() + lo.half().float()).reshape(weight.shape)


GRIDS = {"q8_0": q8_0_values, "q4_0": q4_0_values, "q4_1": q4_1_values}
