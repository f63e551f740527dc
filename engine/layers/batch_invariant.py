"""Linear layers whose per-row results do not depend on how many rows run together.

A matrix product over 1 row and over 32 rows may pick different kernels or
blockings, and so round differently. In deterministic mode every linear layer
multiplies fixed-size tiles of rows (the last one zero-padded), so each row
always goes through the same kernel with the same reduction order, whatever
else is in the batch. The cost: small batches compute a whole tile, and large
ones read the weights once per tile instead of once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TILE_ROWS = 16


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    count = rows.shape[0]
    padded = -(-count // TILE_ROWS) * TILE_ROWS
    buffer = rows.new_zeros(padded, shape[-1])
    buffer[:count] = rows
    out = torch.cat(
        [F.linear(buffer[i : i + TILE_ROWS], weight, bias) for i in range(0, padded, TILE_ROWS)]
    )
    return out[:count].reshape(*shape[:-1], weight.shape[0]).to(x.dtype)


def make_linear_layers_batch_invariant(model: nn.Module) -> int:
    """Give every linear layer of `model` the tiled method; returns how many."""
    from engine.layers.linear_methods import DENSE, MethodLinear, TiledMethod

    count = 0
    for module in model.modules():
        if isinstance(module, MethodLinear):
            if module.method is not DENSE:
                raise ValueError(
                    f"{module.method.name} weights have no batch-invariant product; "
                    "deterministic mode needs dense weights"
                )
            module.method = TiledMethod()
            count += 1
    return count
