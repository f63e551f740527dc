"""Packed linear layers on a GPU: the Triton kernels over the weights as the layer holds them.

`Int4GroupMethod` and `Fp8BlockMethod` (engine/layers/packed_methods.py)
call these for CUDA activations:

- INT4: `w4a16_gemm` reads the layer's `weight_packed` words and bf16
  `weight_scale` directly (the checkpoint's layout, engine/gpu_kernels/w4a16.py).
- FP8: `fp8_block_linear` quantizes the activations per token and group of
  128 (DeepSeek's recipe) and multiplies by the e4m3 weight with one scale per
  128x128 block. A layer whose pieces start on the checkpoint's blocks (the
  real checkpoints' layers, and rank slices of whole blocks) holds that grid as
  `weight_scale`, and it goes to the kernel as it is when the columns start
  on a block too. A layer that fell back to one scale row per weight row
  gives the grid back only where each block of rows shares one scale row
  (derived once); otherwise, or with columns that start inside a block, the
  layer dequantizes a chunk of rows at a time instead.
"""

from __future__ import annotations

import torch
from torch import nn


def int4_linear(layer: nn.Linear, x: torch.Tensor, group: int) -> torch.Tensor:
    from engine.gpu_kernels.w4a16 import w4a16_gemm

    flat = x.reshape(-1, x.shape[-1])
    out = w4a16_gemm(flat, layer.weight_packed, layer.weight_scale, group)
    if layer.bias is not None:
        out = out + layer.bias.to(out.dtype)
    return out.view(*x.shape[:-1], out.shape[-1])


def fp8_block_grid(layer: nn.Linear) -> torch.Tensor | None:
    """The [ceil(N/bn), ceil(K/bk)] block scales of an Fp8BlockMethod layer, or None:
    its own `weight_scale` in grid form, derived from per-row scales otherwise."""
    method = layer.method
    if method.col_offset:
        return None
    if method.scale_rows == method.block[0]:
        return layer.weight_scale
    return block_grid_of_rows(layer.weight_scale, method.block[0])


def block_grid_of_rows(row_scales: torch.Tensor, block_rows: int) -> torch.Tensor | None:
    """The scales of each block of `block_rows` rows, when every row of a block has its
    block's scales (rows that start on a block boundary); else None."""
    first_rows = row_scales[::block_rows]
    expanded = first_rows.repeat_interleave(block_rows, dim=0)[: row_scales.shape[0]]
    if not torch.equal(expanded, row_scales):
        return None
    return first_rows.contiguous()


def fp8_linear(layer: nn.Linear, x: torch.Tensor, grid: torch.Tensor, block) -> torch.Tensor:
    from engine.gpu_kernels.fp8_block_gemm import fp8_block_linear

    out = fp8_block_linear(x, layer.weight, grid, block)
    if layer.bias is not None:
        out = out + layer.bias.to(out.dtype)
    return out
