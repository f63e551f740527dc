"""FP8 block-quantized weights (DeepSeek V3, Kimi K2 / K2-Instruct): `float8_e4m3fn` plus one scale per block.

Format (config `quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [128, 128]}`): a linear layer's `weight` [out, in] is
e4m3, and `weight_scale_inv` [ceil(out/128), ceil(in/128)] float32 holds, per
128x128 block, the factor that turns the stored values back into weights
(the name is historical: quantization divided by it). Blocks at the right and
bottom edges may be partial.

On CPU the engine dequantizes at load to the serving dtype (bfloat16 in
practice). This module is the only place that knows the format, so a GPU
path can keep the FP8 weights and their scales for an FP8 matmul instead.
"""

from __future__ import annotations

import torch

from engine.errors import CheckpointError
from engine.kv.quant import FP8_DTYPE, FP8_MAX, HALF_TRICK_FACTOR, fp8_bits_to_half
from engine.weights.packed_pieces import Fp8Piece
from engine.weights.parts import ModulePartsDecoder, Tensors

DEFAULT_BLOCK = (128, 128)


def scale_grid(shape: tuple[int, int], block: tuple[int, int]) -> tuple[int, int]:
    """How many blocks cover a weight of `shape`: partial edge blocks count."""
    return -(-shape[0] // block[0]), -(-shape[1] // block[1])


def quantize_fp8_block(
    weight: torch.Tensor, block: tuple[int, int] = DEFAULT_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (e4m3 weight, float32 weight_scale_inv per block): amax / 448 scaling."""
    rows, cols = weight.shape
    grid = scale_grid((rows, cols), block)
    padded = weight.new_zeros(grid[0] * block[0], grid[1] * block[1], dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(grid[0], block[0], grid[1], block[1])
    amax = blocks.abs().amax(dim=(1, 3))
    scale_inv = (amax / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    scaled = blocks / scale_inv[:, None, :, None]
    quantized = scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(padded.shape)
    return quantized[:rows, :cols].contiguous(), scale_inv


def dequantize_fp8_block(
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = DEFAULT_BLOCK,
    dtype: torch.dtype = torch.bfloat16,
    name: str = "weight",
) -> torch.Tensor:
    """e4m3 weight [out, in] times its per-block scale, in `dtype`."""
    if weight.dim() != 2:
        raise CheckpointError(f"{name}: FP8 block weights must be 2-D, got {tuple(weight.shape)}")
    rows, cols = weight.shape
    expected = scale_grid((rows, cols), block)
    if tuple(scale_inv.shape) != expected:
        raise CheckpointError(
            f"{name}_scale_inv has shape {tuple(scale_inv.shape)}, expected {expected} "
            f"for a {rows}x{cols} weight in {block[0]}x{block[1]} blocks"
        )
    # The bit-moving decode is exact and far faster than torch's fp8 cast on CPU;
    # its 2**-8 offset folds into the scale.
    values = fp8_bits_to_half(weight)
    scales = scale_inv.float() * HALF_TRICK_FACTOR
    out = torch.empty(rows, cols, dtype=dtype, device=weight.device)
    # One row of blocks at a time keeps the expanded scales to block_rows x cols.
    for index, start in enumerate(range(0, rows, block[0])):
        stop = min(start + block[0], rows)
        column_scales = scales[index].repeat_interleave(block[1])[:cols]
        out[start:stop] = (values[start:stop].float() * column_scales).to(dtype)
    return out


class Fp8BlockDecoder(ModulePartsDecoder):
    """Turns each FP8 `weight` + `weight_scale_inv` pair into a dequantized `weight`."""

    required_parts = ("weight", "weight_scale_inv")
    format_name = "FP8 block-quantized"

    def __init__(self, block: tuple[int, int], dtype: torch.dtype):
        self.block = block
        self.dtype = dtype

    def part_of(self, name: str, tensor: torch.Tensor) -> tuple[str, str] | None:
        if name.endswith(".weight_scale_inv"):
            return name[: -len(".weight_scale_inv")], "weight_scale_inv"
        if name.endswith(".weight") and tensor.dtype == FP8_DTYPE:
            return name[: -len(".weight")], "weight"
        return None

    def decode(self, module: str, parts: dict[str, torch.Tensor]) -> Tensors:
        if self.keep_packed(module):
            weight, scale_inv = parts["weight"], parts["weight_scale_inv"]
            expected = scale_grid(tuple(weight.shape), self.block)
            if weight.dim() != 2 or tuple(scale_inv.shape) != expected:
                raise CheckpointError(
                    f"{module}.weight_scale_inv has shape {tuple(scale_inv.shape)}, expected "
                    f"{expected} for a {tuple(weight.shape)} weight"
                )
            yield f"{module}.weight", Fp8Piece.from_checkpoint(weight, scale_inv, self.block)
            return
        weight = dequantize_fp8_block(
            parts["weight"], parts["weight_scale_inv"], self.block, self.dtype, f"{module}.weight"
        )
        yield f"{module}.weight", weight
