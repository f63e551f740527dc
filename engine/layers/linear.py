"""Linear layers whose weights may arrive in several checkpoint tensors.

Fusing q/k/v (and gate/up) into one matrix turns three small matrix products
into one, which matters on CPU where per-op overhead is a large share of a
decode step. The checkpoint keeps them separate, so the fused layer knows
where each shard goes.
"""

from __future__ import annotations

import torch
from torch import nn


class FusedLinear(nn.Linear):
    """A Linear whose output rows are the concatenation of named shards."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False):
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, size in shard_sizes.items():
            self.shard_offsets[name] = (offset, size)
            offset += size

    def load_shard(self, shard: str, kind: str, tensor: torch.Tensor) -> None:
        """Copy one checkpoint tensor ('weight' or 'bias') into its rows."""
        offset, size = self.shard_offsets[shard]
        target = self.weight if kind == "weight" else self.bias
        if target is None:
            raise KeyError(f"{shard}.{kind}: this layer has no {kind}")
        if tensor.shape[0] != size or tensor.shape[1:] != target.shape[1:]:
            raise ValueError(
                f"{shard}.{kind} has shape {tuple(tensor.shape)}, expected "
                f"({size}, {', '.join(map(str, target.shape[1:]))})".replace(", )", ")")
            )
        with torch.no_grad():
            target[offset : offset + size].copy_(tensor)
