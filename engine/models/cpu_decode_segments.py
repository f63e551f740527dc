"""A decode step fused in runs of layers, for models whose layers are not all fusable.

The whole-model step (engine/models/cpu_decode_step.py) declines every step when one
layer is something its C code does not run: a layer a file leaves dense (a tensor
type no grid holds), one of another attention type. Before the step took q, k and v
as separate parts, a GLM-4.5-shaped Q4_K_M file (a Q6_K value projection beside Q4_K
q and k in some layers) decoded one stream at 0.8x llama.cpp that way, every layer a
Python module. Here each maximal run of fusable layers is one C call and the layers
between stay modules, in order, on the same hidden state."""

from __future__ import annotations

from collections.abc import Callable

import torch


class FusedSegments:
    """Layers in order: a fused run (a FusedDecode over layers [first, first + n)) or one
    module layer. `run` takes a decode step whole or declines it untouched."""

    def __init__(self, pieces: list, fused: list):
        self.pieces = pieces  # (fused?, a FusedDecode or a decoder layer module), in order
        self.fused = fused

    @classmethod
    def build(cls, layers: list, fusable: Callable, build: Callable) -> FusedSegments | None:
        """Runs of layers that `fusable(layer, run's first layer)` accepts, each made by
        `build(run, first, total)`; None when no run forms."""
        pieces, fused, start = [], [], 0
        while start < len(layers):
            end = start
            while end < len(layers) and fusable(layers[end], layers[start]):
                end += 1
            step = build(layers[start:end], start, len(layers)) if end > start else None
            if step is None:
                pieces.append((False, layers[start]))
                start += 1
                continue
            pieces.append((True, step))
            fused.append(step)
            start = end
        return cls(pieces, fused) if fused else None

    def run(self, x: torch.Tensor, positions: torch.Tensor, ctx) -> bool:
        """Every layer on x [tokens, hidden] in place; False (x untouched) unless every
        fused run takes the step."""
        if not all(step.accepts(x, ctx) for step in self.fused):
            return False
        for is_fused, piece in self.pieces:
            if is_fused:
                piece.run_accepted(x, positions, ctx)
            else:
                x.copy_(piece(positions, x, ctx))
        return True
