"""How a linear layer computes: an object the layer owns and calls, chosen at load.

Every linear layer of a model (engine/layers/linear.py) forwards through
`self.method.apply(self, x)`. The method holds whatever form the weight is
kept in and knows how to multiply with it:

- `DenseMethod`: the layer's own `weight` (BF16 or float32), one product
  (engine/host/bf16_products.py: float32 for many BF16 rows where torch lacks BF16 kernels);
- `TiledMethod` (engine/layers/batch_invariant.py): the same weight in fixed
  tiles of rows, so a row's result does not depend on its batch (`--deterministic`);
- `GridMethod` (engine/layers/cpu_grid_weights.py): 4-/8-bit grid weights
  packed for the CPU kernels, the dense weight kept only where the kernel
  loses to it;
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
from torch import nn

from engine.host import bf16_products


class DenseMethod:
    name = "dense"

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return bf16_products.linear(x, layer.weight, layer.bias)

    def logits(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """The output head's product; the model casts it to float32 after gathering
        the vocabulary shards. A method that can write float32 directly does."""
        return self.apply(layer, x)

    def weight_bytes(self, layer: nn.Linear) -> int:
        return layer.weight.numel() * layer.weight.element_size()

    def bytes_beside(self, layer: nn.Linear) -> int:
        """Bytes the method keeps outside the layer's parameters (none by default)."""
        return 0


DENSE = DenseMethod()


def describe_methods(model: nn.Module) -> dict[str, int]:
    """How many linear layers use each method (start-up log, stats)."""
    return dict(Counter(m.method.name for m in model.modules() if isinstance(m, MethodLinear)))


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights this rank holds: every parameter once (tied ones once), plus
    what methods keep beside them (a CPU grid method's packed form)."""
    held = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    beside = sum(m.method.bytes_beside(m) for m in model.modules() if isinstance(m, MethodLinear))
    # Modules that keep weights outside parameters (a grid embedding, MLA's latent grids).
    beside += sum(m.packed_bytes() for m in model.modules() if hasattr(m, "packed_bytes"))
    return sum(held.values()) + beside


class MethodLinear(nn.Linear):
    """nn.Linear whose product is its method's (dense unless the engine chose another)."""

    method = DENSE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def weight_bytes(self) -> int:
        return self.method.weight_bytes(self)
