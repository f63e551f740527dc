"""How a linear layer computes: an object the layer owns and calls, chosen at load.

Every linear layer of a model (engine/layers/linear.py) forwards through
`self.method.apply(self, x)`. The method holds whatever form the weight is
kept in and knows how to multiply with it:

- `DenseMethod`: the layer's own `weight` (BF16 or float32), one F.linear;
- `TiledMethod`: the same weight in fixed tiles of rows, so a row's result
  does not depend on its batch (`--deterministic`; engine/layers/batch_invariant.py);
- `GridMethod`: 4-/8-bit grid weights packed for the CPU kernels
  (engine/layers/cpu_grid_weights.py), the dense weight kept only where the
  kernel loses to it;
- `Fp8BlockMethod`, `Int4GroupMethod`: the checkpoint's FP8 block-scaled or
  INT4 group-quantized weights kept as stored (engine/layers/packed_methods.py).

The engine chooses: the loader gives packed checkpoints their packed method
before any memory is allocated; on CPU the engine may then swap a dense
method for a grid method (exact repacking) or, in deterministic mode, for
the tiled one. Reading a model class shows the call; `describe_methods`
tells the log and /v1/engine/stats what was chosen.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn


class DenseMethod:
    name = "dense"

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias)

    def logits(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """The output head's product; the model casts it to float32 after gathering
        the vocabulary shards. A method that can write float32 directly does."""
        return self.apply(layer, x)

    def weight_bytes(self, layer: nn.Linear) -> int:
        return layer.weight.numel() * layer.weight.element_size()


DENSE = DenseMethod()


class TiledMethod(DenseMethod):
    """Fixed tiles of rows (the last zero-padded): batch-invariant rounding."""

    name = "tiled"

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        from engine.layers.batch_invariant import tiled_linear

        return tiled_linear(x, layer.weight, layer.bias)


class GridMethod(DenseMethod):
    """A CPU grid-packed weight (GridWeight: int8 activations; PackedWeight: torch's
    int4 kernel up to a few rows, the dense weight beyond)."""

    name = "cpu-grid"

    def __init__(self, packed, max_packed_rows: int):
        self.packed = packed
        self.max_packed_rows = max_packed_rows

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        from engine.layers.cpu_grid_weights import GridWeight

        rows = x.numel() // x.shape[-1]
        packed = self.packed
        if isinstance(packed, GridWeight):
            flat = x.reshape(rows, x.shape[-1])
            if flat.dtype not in (torch.float32, torch.bfloat16):
                flat = flat.float()
            out = packed.matmul(flat.contiguous())  # the kernel adds the bias
            return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
        if rows > self.max_packed_rows:
            return F.linear(x, layer.weight, layer.bias)
        flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16).contiguous()
        out = packed.matmul(flat)
        if layer.bias is not None:
            out = out + layer.bias
        return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)

    def logits(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """The int8 kernel writes float32 logits from its accumulators: no BF16
        rounding of the logits and no copy to cast them back."""
        from engine.layers.cpu_grid_weights import GridWeight

        packed = self.packed
        if not isinstance(packed, GridWeight) or x.dtype not in (torch.float32, torch.bfloat16):
            return super().logits(layer, x)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        return packed.matmul(flat, torch.float32).reshape(*x.shape[:-1], packed.rows)

    def weight_bytes(self, layer: nn.Linear) -> int:
        return self.packed.nbytes + super().weight_bytes(layer)


def grid_weight_of(layer: nn.Module):
    """The CPU grid-packed weight a layer multiplies with, or None."""
    method = getattr(layer, "method", None)
    return method.packed if isinstance(method, GridMethod) else None


def describe_methods(model: nn.Module) -> dict[str, int]:
    """How many linear layers use each method (start-up log, stats)."""
    return dict(Counter(m.method.name for m in model.modules() if isinstance(m, MethodLinear)))


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights this rank holds: every parameter once (tied ones once), plus
    the packed forms CPU grid methods keep beside them."""
    held = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    grids = sum(
        m.method.packed.nbytes
        for m in model.modules()
        if isinstance(m, MethodLinear) and isinstance(m.method, GridMethod)
    )
    return sum(held.values()) + grids


class MethodLinear(nn.Linear):
    """nn.Linear whose product is its method's (dense unless the engine chose another)."""

    method = DENSE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def weight_bytes(self) -> int:
        return self.method.weight_bytes(self)
