"""A MoE block's routed experts stacked for the fused MoE kernel (engine/gpu_kernels/fused_moe.py).

The loader fills one module per expert (each expert's gate/up and down are
ordinary linear layers, so tensor-parallel slicing and packed methods work
the same as anywhere). On a GPU the fused kernel wants every expert of the
layer in one tensor per projection; `stack_experts` builds those once after
loading and points each expert's parameters at its slice of the stack, so
the weights are held once. All of a rank's experts must use the same method
(dense, fp8-block or int4-group), as a checkpoint stores them; otherwise,
or for FP8 slices without an exact block grid, the block keeps running its
experts one by one.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.gpu_linear import block_grid_of_rows, fp8_block_grid


def _stack_into_views(params: list[nn.Parameter]) -> torch.Tensor:
    """One stacked tensor; each parameter becomes a view of its row (held once)."""
    stacked = torch.stack([p.data for p in params])
    for index, param in enumerate(params):
        param.data = stacked[index]
    return stacked


def stack_experts(experts: list[nn.Module]):
    """The fused kernel's weight container for these experts (all of one method), or None."""
    from engine.gpu_kernels.moe_weights import DenseExperts, Fp8BlockExperts, Int4Experts

    gate_up = [e.gate_up_proj for e in experts]
    down = [e.down_proj for e in experts]
    layers = gate_up + down
    if any(layer.bias is not None for layer in layers):
        return None
    names = {layer.method.name for layer in layers}
    if names == {"dense"}:
        return DenseExperts(
            _stack_into_views([m.weight for m in gate_up]),
            _stack_into_views([m.weight for m in down]),
        )
    if names == {"int4-group"}:
        groups = {layer.method.group for layer in layers}
        if len(groups) != 1 or any(getattr(m, "int4_tiles", False) for m in layers):
            return None  # CPU-tiled words are not the kernel's order (never so on a GPU)
        return Int4Experts(
            _stack_into_views([m.weight_packed for m in gate_up]),
            _stack_into_views([m.weight_scale for m in gate_up]),
            _stack_into_views([m.weight_packed for m in down]),
            _stack_into_views([m.weight_scale for m in down]),
            intermediate=down[0].in_features,
            group_size=groups.pop(),
        )
    if names == {"fp8-block"}:
        block = gate_up[0].method.block
        inter = down[0].in_features
        w13_grids, w2_grids = [], []
        for up_layer, down_layer in zip(gate_up, down, strict=True):
            halves = [_half_grid(up_layer, rows, block) for rows in (0, inter)]
            w2 = fp8_block_grid(down_layer, block, down_layer.method.col_offset)
            if any(g is None for g in halves) or w2 is None:
                return None
            w13_grids.append(torch.cat(halves))
            w2_grids.append(w2)
        return Fp8BlockExperts(
            _stack_into_views([m.weight for m in gate_up]),
            torch.stack(w13_grids),
            _stack_into_views([m.weight for m in down]),
            torch.stack(w2_grids),
        )
    return None


def _half_grid(layer: nn.Module, start: int, block) -> torch.Tensor | None:
    """The block grid of the gate (start 0) or up half of a fused gate/up layer."""
    if layer.method.col_offset:
        return None
    inter = layer.out_features // 2
    return block_grid_of_rows(layer.weight_scale_rows[start : start + inter], block[0])
