"""Packed linear layers on a GPU: the Triton kernels over the weights as the layer holds them.

`Int4GroupMethod` and `Fp8BlockMethod` (engine/layers/packed_methods.py)
call these for CUDA activations:

- INT4: `w4a16_gemm` reads the layer's `weight_packed` words and bf16
  `weight_scale` directly (the checkpoint's layout, engine/gpu_kernels/w4a16.py).
- FP8: `fp8_block_linear` quantizes the activations per token and group of
  128 (DeepSeek's recipe) and multiplies by the e4m3 weight with one scale per
  128x128 block. The layer keeps each row's block scales (so any row slice
  stays exact); the kernel wants the block grid, which those rows give back
  exactly when every 128-row block has one scale and the columns start on a
  block, as they do for the real checkpoints' layers and rank slices. The
  grid is derived once per layer; a layer where it does not exist falls
  back to dequantizing a chunk of rows at a time.
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


def fp8_block_grid(layer: nn.Linear, block: tuple[int, int], col_offset: int):
    """[ceil(N/bn), ceil(K/bk)] block scales equal to the layer's row scales, or None."""
    if col_offset:
        return None
    return block_grid_of_rows(layer.weight_scale_rows, block[0])


def block_grid_of_rows(row_scales: torch.Tensor, block_rows: int) -> torch.Tensor | None:
    """The scales of each block of `block_rows` rows, when every row of a block has its
    block's scales (rows that start on a block boundary); else None."""
    first_rows = row_scales[::block_rows]
    expanded = first_rows.repeat_interleave(block_rows, dim=0)[: row_scales.shape[0]]
    if not torch.equal(expanded, row_scales):
        return None
    return first_rows.contiguous()


def fp8_linear(layer: nn.Linear, x: torch.Tensor, grid: torch.Tensor, block) -> torch.Tensor:
    from engine.gpu_kernels.fp8_block import fp8_block_linear

    out = fp8_block_linear(x, layer.weight, grid, block)
    if layer.bias is not None:
        out = out + layer.bias.to(out.dtype)
    return out
