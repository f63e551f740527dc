"""Dense linear weights quantized at load for the CPU grid kernel (`--cpu-weights`).

A BF16, FP16 or float32 checkpoint on CPU multiplies its dense weights: two
bytes a weight read on every decode step. With `cpu_weights` set to `q8_0`
or `q4_0`, each dense linear layer's float32 weight is rounded onto that
llama.cpp grid at load (engine/weights/grid_rounding.py, as llama.cpp's own
quantizers do) and the grid packer then keeps it packed (1.06 or 0.56 bytes
a weight) for the int8-activation kernel. The quality it costs is measured by
bench/cpu_weights_accuracy.py (docs/BENCHMARKS.md).

Left alone: weights already on a grid (a GGUF's Q4_0/Q4_1/Q8_0), layers whose
matrix something else reads (`keeps_dense`: MLA's kv_b_proj), a weight shared
with a non-linear module (a tied embedding: the head would change the
embedding too), and rows that are not whole groups of 32. With `q4_0` the
output head takes Q8_0, as llama.cpp keeps its head above the body's type.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.cpu_grid_weights import GROUP, pack_if_on_grid
from engine.layers.linear_methods import DENSE, MethodLinear
from engine.weights.grid_rounding import GRIDS

CPU_WEIGHTS = ("checkpoint", "q8_0", "q4_0")


def quantize_dense_layers(model: nn.Module, grid: str) -> int:
    """Round every eligible dense float32 linear weight of `model` onto `grid` in place;
    returns how many. Call on the float32 model, before grid packing."""
    if grid not in GRIDS:
        raise ValueError(f"unknown CPU weight grid {grid!r}; choose from {', '.join(GRIDS)}")
    shared = {
        id(param)
        for module in model.modules()
        if not isinstance(module, nn.Linear)
        for param in module.parameters(recurse=False)
    }
    head = getattr(model, "lm_head", None)
    count = 0
    for module in model.modules():
        if not isinstance(module, MethodLinear) or module.method is not DENSE:
            continue
        weight = module.weight
        if (
            getattr(module, "keeps_dense", False)
            or id(weight) in shared
            or weight.dtype != torch.float32
            or weight.dim() != 2
            or weight.shape[1] % GROUP
            or pack_if_on_grid(weight, "int8") is not None  # already on a grid: exact as is
        ):
            continue
        rounding = GRIDS["q8_0" if module is head else grid]
        with torch.no_grad():
            weight.copy_(rounding(weight))
        count += 1
    return count
