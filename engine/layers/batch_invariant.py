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

from engine.layers.linear_methods import DENSE, DenseMethod, MethodLinear
from engine.layers.packed_methods import CHUNK_ROWS, is_packed_method

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


class TiledMethod(DenseMethod):
    """Fixed tiles of rows (the last zero-padded): batch-invariant rounding."""

    name = "tiled"

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return tiled_linear(x, layer.weight, layer.bias)


class BatchInvariantPacked:
    """A checkpoint-precision (FP8 block, INT4 group) layer in deterministic mode.

    Its kernels choose their path by the number of rows (the FP8 kernel up to a
    few rows, dequantized chunks and torch's GEMM beyond), so a row's rounding
    would depend on its batch. Here a fixed chunk of weight rows is dequantized
    exactly (the packed method's own `dequantize`) and multiplied through the
    same fixed tiles of activation rows as dense layers: each row meets the
    same weights, in the same shapes, however many rows run with it. The
    weights stay packed; the cost is dequantizing per call."""

    def __init__(self, packed):
        self.packed = packed
        self.name = f"{packed.name}-tiled"

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(*x.shape[:-1], layer.out_features)
        for start in range(0, layer.out_features, CHUNK_ROWS):
            rows = slice(start, min(start + CHUNK_ROWS, layer.out_features))
            weight = self.packed.dequantize(layer, rows, x.dtype)
            bias = None if layer.bias is None else layer.bias[rows]
            out[..., rows] = tiled_linear(x, weight, bias)
        return out

    def logits(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self.apply(layer, x)

    def weight_bytes(self, layer: nn.Linear) -> int:
        return self.packed.weight_bytes(layer)

    def bytes_beside(self, layer: nn.Linear) -> int:
        return self.packed.bytes_beside(layer)


def make_linear_layers_batch_invariant(model: nn.Module) -> int:
    """Give every linear layer of `model` a batch-invariant method; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, MethodLinear):
            if is_packed_method(module.method):
                module.method = BatchInvariantPacked(module.method)
            elif module.method is DENSE:
                module.method = TiledMethod()
            else:
                raise ValueError(
                    f"{module.method.name} weights have no batch-invariant product; "
                    "deterministic mode needs dense or checkpoint-packed weights"
                )
            count += 1
    return count
