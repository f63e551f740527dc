"""Reassembling quantized modules whose tensors arrive one at a time.

A quantized linear layer is stored as several tensors (`weight` plus
`weight_scale_inv`; or `weight_packed`, `weight_scale`, `weight_shape`), and
shards need not keep them together or in order. A decoder collects each
module's parts as they stream past, decodes the module to one plain `weight`
when the last part arrives, and at the end names any module left incomplete.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from engine.errors import CheckpointError
from engine.weights.lazy import materialize

Tensors = Iterator[tuple[str, torch.Tensor]]


class ModulePartsDecoder:
    """Base: subclasses say which tensors are parts (`part_of`) and how to decode them."""

    required_parts: tuple[str, ...] = ()
    format_name = "quantized"
    # Modules (by the model's checkpoint name) whose layers keep the packed form:
    # they get a piece (engine/layers/packed_methods.py) instead of a dequantized weight.
    keep_packed = staticmethod(lambda module: False)

    def part_of(self, name: str, tensor: torch.Tensor) -> tuple[str, str] | None:
        """(module name, part name) when `name` is a part of a quantized module, else None."""
        raise NotImplementedError

    def decode(self, module: str, parts: dict[str, torch.Tensor]) -> Tensors:
        raise NotImplementedError

    def stream(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Tensors:
        pending: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in tensors:
            found = self.part_of(name, tensor)
            if found is None:
                yield name, tensor
                continue
            module, part = found
            parts = pending.setdefault(module, {})
            parts[part] = materialize(tensor)  # decoded whole, then sliced like any weight
            if all(p in parts for p in self.required_parts):
                del pending[module]
                yield from self.decode(module, parts)
        if pending:
            module, parts = next(iter(pending.items()))
            missing = [f"{module}.{p}" for p in self.required_parts if p not in parts]
            raise CheckpointError(
                f"{self.format_name} checkpoint: {', '.join(missing)} is missing, so "
                f"{module} cannot be decoded ({len(pending)} module(s) incomplete); "
                "is a shard missing or the download incomplete?"
            )
