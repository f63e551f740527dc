"""Quantized checkpoint variants, written the way real releases store them.

- FP8 block (Kimi K2-Instruct, DeepSeek-V3, GLM-4.5-FP8): `float8_e4m3fn`
  projection weights with a float32 `weight_scale_inv` per 128x128 block
  (partial blocks at the edges), `quant_method: fp8`.
- INT4 experts (K2-Thinking, K2.5, K2.6): compressed-tensors
  `pack-quantized` routed experts: `weight_packed` int32 words of eight
  nibbles (value + 8, first value in the low nibble, along the input dim),
  bf16 `weight_scale` per group of 32 inputs, `weight_shape`; everything in
  the `ignore` list stays unquantized.

Each variant comes with a reference folder holding the dequantized weights in
transformers' own form, so transformers can compute the expected outputs. The
quantizers here are written the plain way (loops), independent of the
engine's vectorized dequantizers they check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from engine.devtools.testing.layouts import copy_checkpoint, read_tensors

# Kimi K2-Thinking's INT4 ignore list: everything but the routed experts stays bf16.
KIMI_INT4_IGNORE = [
    "lm_head",
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
]


def is_linear_weight(name: str) -> bool:
    return name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")


def is_routed_expert(name: str) -> bool:
    return ".mlp.experts." in name and is_linear_weight(name)


def fp8_block_reference(weight: torch.Tensor, block: tuple[int, int]):
    """Straightforward per-block FP8 quantization: (e4m3 weight, scale_inv, dequantized float32)."""
    rows, cols = weight.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale_inv = torch.empty(grid, dtype=torch.float32)
    restored = torch.empty(rows, cols, dtype=torch.float32)
    for i in range(grid[0]):
        for j in range(grid[1]):
            rs = slice(i * block[0], min((i + 1) * block[0], rows))
            cs = slice(j * block[1], min((j + 1) * block[1], cols))
            tile = weight[rs, cs].float()
            scale = (tile.abs().max() / 448.0).clamp_min(1e-12)
            q = (tile / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            quantized[rs, cs] = q
            scale_inv[i, j] = scale
            restored[rs, cs] = q.float() * scale
    return quantized, scale_inv, restored


def as_fp8_block(
    src: Path,
    dst: Path,
    ref: Path,
    block=(128, 128),
    quantizes: Callable[[str], bool] = is_linear_weight,
) -> tuple[Path, Path]:
    """FP8 block-quantize every projection (the weights `quantizes` names, where a release
    keeps another set): (quantized folder, reference folder of dequantized weights)."""
    quantized: dict[str, torch.Tensor] = {}
    restored: dict[str, torch.Tensor] = {}
    for name, tensor in read_tensors(src).items():
        if quantizes(name):
            q, scale_inv, dequantized = fp8_block_reference(tensor, block)
            quantized[name] = q
            quantized[name + "_scale_inv"] = scale_inv
            restored[name] = dequantized
        else:
            quantized[name] = restored[name] = tensor

    def edit(config: dict) -> dict:
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(block),
        }
        return config

    return copy_checkpoint(src, dst, quantized, edit), copy_checkpoint(src, ref, restored)


def int4_group_reference(weight: torch.Tensor, group: int):
    """Symmetric INT4 per group of inputs: (int values -8..7, bf16 scales, dequantized float32)."""
    rows, cols = weight.shape
    groups = -(-cols // group)
    values = torch.empty(rows, cols, dtype=torch.int8)
    scales = torch.empty(rows, groups, dtype=torch.bfloat16)
    for g in range(groups):
        cs = slice(g * group, min((g + 1) * group, cols))
        tile = weight[:, cs].float()
        scale = (tile.abs().amax(dim=1) / 7.0).clamp_min(1e-8).to(torch.bfloat16)
        scales[:, g] = scale
        values[:, cs] = (tile / scale.float()[:, None]).round().clamp(-8, 7).to(torch.int8)
    restored = values.float() * scales.float().repeat_interleave(group, dim=1)[:, :cols]
    return values, scales, restored


def pack_int4_reference(values: torch.Tensor) -> torch.Tensor:
    """Eight nibbles (value + 8) per int32 along the input dim, first value in the low nibble."""
    rows, cols = values.shape
    words = -(-cols // 8)
    packed = torch.zeros(rows, words, dtype=torch.int32)
    for r in range(rows):
        for w in range(words):
            word = 0
            for i in range(8):
                c = w * 8 + i
                nibble = int(values[r, c]) + 8 if c < cols else 0
                word |= nibble << (4 * i)
            packed[r, w] = word - (1 << 32) if word >= 1 << 31 else word
    return packed


def as_int4_experts(src: Path, dst: Path, ref: Path, group: int = 32) -> tuple[Path, Path]:
    """Pack routed experts as compressed-tensors INT4: (quantized folder, reference folder)."""
    quantized: dict[str, torch.Tensor] = {}
    restored: dict[str, torch.Tensor] = {}
    for name, tensor in read_tensors(src).items():
        if is_routed_expert(name):
            values, scales, dequantized = int4_group_reference(tensor, group)
            module = name[: -len(".weight")]
            quantized[module + ".weight_packed"] = pack_int4_reference(values)
            quantized[module + ".weight_scale"] = scales
            quantized[module + ".weight_shape"] = torch.tensor(
                list(tensor.shape), dtype=torch.int32
            )
            restored[name] = dequantized
        else:
            quantized[name] = restored[name] = tensor

    def edit(config: dict) -> dict:
        config["quantization_config"] = int4_quantization_config(group)
        return config

    return copy_checkpoint(src, dst, quantized, edit), copy_checkpoint(src, ref, restored)


def int4_quantization_config(group: int = 32, ignore: list[str] | None = None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group,
                    "dynamic": False,
                    "actorder": None,
                },
            }
        },
        "ignore": list(KIMI_INT4_IGNORE if ignore is None else ignore),
        "kv_cache_scheme": None,
    }
