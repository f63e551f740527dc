"""A MoE block's routed experts stacked for the fused MoE kernel (engine/gpu_kernels/fused_moe.py).

The loader fills one module per expert (each expert's gate/up and down are
ordinary linear layers, so tensor-parallel slicing and packed methods work
the same as anywhere). On a GPU the fused kernel wants every expert of the
layer in one tensor per projection; `stack_experts` builds those once after
loading and points each expert's parameters at its slice of the stack, so
the weights are held once. All of a rank's experts must use the same method
(dense, fp8-block or int4-group), as a checkpoint stores them; otherwise,
or for FP8 slices without an exact block grid, the block keeps running its
experts one by one. FP8 experts whose pieces start on the checkpoint's blocks
hold their block grids, which are stacked the same way (views, held once);
experts that fell back to per-row scales have each half's grid derived.
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
        w13_grids = [_gate_up_grid(layer, block) for layer in gate_up]
        w2_grids = [fp8_block_grid(layer) for layer in down]
        if any(g is None for g in w13_grids + w2_grids):
            return None
        return Fp8BlockExperts(
            _stack_into_views([m.weight for m in gate_up]),
            _stack_grids(gate_up, w13_grids),
            _stack_into_views([m.weight for m in down]),
            _stack_grids(down, w2_grids),
        )
    return None


def _stack_grids(layers: list[nn.Module], grids: list[torch.Tensor]) -> torch.Tensor:
    """The experts' block grids stacked: views of the stack where the grids are the
    layers' own scales (held once), else a stack of the derived grids."""
    if all(grid is layer.weight_scale for grid, layer in zip(grids, layers, strict=True)):
        return _stack_into_views([layer.weight_scale for layer in layers])
    return torch.stack(grids)


def _gate_up_grid(layer: nn.Module, block) -> torch.Tensor | None:
    """The fused gate/up layer's grid as the kernel reads it: the gate half's block
    rows, then the up half's (the layer's own grid when the halves start on blocks)."""
    method = layer.method
    if method.col_offset:
        return None
    inter = layer.out_features // 2
    if method.scale_rows == block[0]:
        return layer.weight_scale if inter % block[0] == 0 else None
    halves = [block_grid_of_rows(layer.weight_scale[s : s + inter], block[0]) for s in (0, inter)]
    return None if any(h is None for h in halves) else torch.cat(halves)
