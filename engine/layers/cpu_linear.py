"""Linear layers for BF16 models on CPUs without native BF16 matrix units.

On such CPUs a BF16 matrix-vector product (one row: decode of one sequence)
is memory-bound and BF16 halves the bytes, but a BF16 product over several
rows runs a slow conversion path: measured on the development machine, a
16-row product took 13.5 ms in BF16 and 6.0 ms in float32 for the same
3072x576 weight. So each linear layer keeps its BF16 weight for one- and
two-row inputs and a float32 copy of the same values for larger ones; the
float32 result is rounded to BF16, as a BF16 product with float32
accumulation would be. The copy costs twice the BF16 weight memory, stated in
the start-up log.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Up to this many rows the BF16 weight is used (memory-bound regime).
BF16_MAX_ROWS = 2


def _dual_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if rows <= BF16_MAX_ROWS:
        return F.linear(x, module.weight, module.bias)
    bias = None if module.bias is None else module.bias.float()
    return F.linear(x.float(), module.weight_f32, bias).to(x.dtype)


def add_float32_weight_copies(model: nn.Module) -> int:
    """Give every BF16 nn.Linear a float32 copy for multi-row inputs; returns bytes added."""
    added = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.dtype == torch.bfloat16:
            module.weight_f32 = module.weight.detach().float()
            module.forward = lambda x, m=module: _dual_forward(m, x)
            added += module.weight_f32.numel() * 4
    return added


def float32_weight(module: nn.Linear) -> torch.Tensor:
    return getattr(module, "weight_f32", module.weight)
