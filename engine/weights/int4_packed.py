"""compressed-tensors INT4 `pack-quantized` weights (Kimi K2-Thinking, K2.5, K2.6 routed experts).

Per quantized linear layer [out, in] the checkpoint stores:
- `weight_packed` int32 [out, ceil(in/8)]: eight 4-bit values per int32 along
  the input dim, the first value in the lowest nibble; each nibble holds the
  signed value plus 8 (so -8..7 becomes 0..15);
- `weight_scale` [out, ceil(in/group_size)] (bfloat16): one scale per group
  of `group_size` (32 for Kimi) consecutive inputs, symmetric (no zero point);
- `weight_shape` int [2]: the unpacked [out, in].
Modules the config's `ignore` list names (attention, shared experts, dense
MLPs, lm_head for Kimi) are stored unquantized and pass through untouched;
one of them stored packed contradicts the config and is refused.

On CPU the engine dequantizes at load to the serving dtype. This module is the
only place that knows the format, so a GPU path can keep the packed weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from engine.errors import CheckpointError, UnsupportedModelError
from engine.weights.packed_pieces import Int4Piece
from engine.weights.parts import ModulePartsDecoder, Tensors

VALUES_PER_INT32 = 8
OFFSET = 8  # stored nibble = value + 8


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Signed int4 values [out, in] in -8..7 -> int32 [out, ceil(in/8)], low nibble first."""
    if int(values.min()) < -8 or int(values.max()) > 7:
        raise ValueError("int4 values must lie in -8..7")
    rows, cols = values.shape
    groups = -(-cols // VALUES_PER_INT32)
    nibbles = torch.zeros(rows, groups * VALUES_PER_INT32, dtype=torch.int64)
    nibbles[:, :cols] = values.to(torch.int64) + OFFSET
    shifts = torch.arange(VALUES_PER_INT32, dtype=torch.int64) * 4
    words = (nibbles.view(rows, groups, VALUES_PER_INT32) << shifts).sum(dim=-1)
    # Reinterpret the unsigned 32-bit words as int32 (two's complement).
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_int4(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """int32 [out, ceil(in/8)] -> signed int8 [out, columns]."""
    shifts = torch.arange(VALUES_PER_INT32, dtype=torch.int32, device=packed.device) * 4
    nibbles = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF
    nibbles = nibbles.view(packed.shape[0], -1)[:, :columns]
    return (nibbles - OFFSET).to(torch.int8)


def dequantize_packed_int4(
    packed: torch.Tensor,
    scale: torch.Tensor,
    weight_shape: tuple[int, int],
    group_size: int,
    dtype: torch.dtype = torch.bfloat16,
    name: str = "weight",
) -> torch.Tensor:
    """Unpacked int4 values times their group's scale, [out, in] in `dtype`; shapes checked."""
    check_packed_int4_shapes(packed, scale, weight_shape, group_size, name)
    rows, cols = weight_shape
    values = unpack_int4(packed, cols).float()
    scales = scale.float().repeat_interleave(group_size, dim=1)[:, :cols]
    return (values * scales).to(dtype)


def check_packed_int4_shapes(
    packed: torch.Tensor,
    scale: torch.Tensor,
    weight_shape: tuple[int, int],
    group_size: int,
    name: str = "weight",
) -> None:
    rows, cols = weight_shape
    expected_packed = (rows, -(-cols // VALUES_PER_INT32))
    if tuple(packed.shape) != expected_packed:
        raise CheckpointError(
            f"{name}_packed has shape {tuple(packed.shape)}, expected {expected_packed} "
            f"for weight_shape {list(weight_shape)} (8 int4 values per int32)"
        )
    if packed.dtype != torch.int32:
        raise CheckpointError(f"{name}_packed has dtype {packed.dtype}, expected int32")
    expected_scale = (rows, -(-cols // group_size))
    if tuple(scale.shape) != expected_scale:
        raise CheckpointError(
            f"{name}_scale has shape {tuple(scale.shape)}, expected {expected_scale} "
            f"for weight_shape {list(weight_shape)} in groups of {group_size}"
        )


@dataclass(frozen=True)
class PackedInt4Scheme:
    group_size: int | None  # None: one scale per output channel
    ignore: tuple[str, ...]

    @classmethod
    def from_quantization_config(cls, qc: dict) -> PackedInt4Scheme:
        groups = qc.get("config_groups") or {}
        if not groups:
            raise CheckpointError("compressed-tensors quantization_config has no config_groups")
        schemes = set()
        for group_name, group in groups.items():
            weights = group.get("weights") or {}
            fmt = group.get("format") or qc.get("format")
            where = f"quantization_config.config_groups.{group_name}"
            if fmt != "pack-quantized":
                raise UnsupportedModelError(
                    f"{where}: compressed-tensors format {fmt!r} is not supported; "
                    "supported: pack-quantized (INT4)"
                )
            if weights.get("num_bits") != 4 or weights.get("type", "int") != "int":
                raise UnsupportedModelError(f"{where}: only 4-bit integer weights are supported")
            if not weights.get("symmetric", True):
                raise UnsupportedModelError(
                    f"{where}: asymmetric INT4 (zero points) is not supported"
                )
            if weights.get("actorder"):
                raise UnsupportedModelError(f"{where}: activation-ordered INT4 is not supported")
            if group.get("input_activations"):
                raise UnsupportedModelError(f"{where}: quantized activations are not supported")
            strategy = weights.get("strategy", "group")
            if strategy == "group":
                schemes.add(int(weights["group_size"]))
            elif strategy == "channel":
                schemes.add(None)
            else:
                raise UnsupportedModelError(f"{where}: INT4 strategy {strategy!r} is not supported")
        if len(schemes) != 1:
            raise UnsupportedModelError(
                "config_groups with different INT4 group sizes are not supported"
            )
        return cls(group_size=schemes.pop(), ignore=tuple(qc.get("ignore") or ()))

    def ignores(self, module: str) -> bool:
        """compressed-tensors matching: an exact module name, or `re:` + a regex matched from the start."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return True
            elif entry == module:
                return True
        return False


class PackedInt4Decoder(ModulePartsDecoder):
    """Turns each `weight_packed` + `weight_scale` + `weight_shape` triple into a `weight`."""

    required_parts = ("weight_packed", "weight_scale", "weight_shape")
    format_name = "compressed-tensors INT4"

    def __init__(self, scheme: PackedInt4Scheme, dtype: torch.dtype, name_prefix: str = ""):
        self.scheme = scheme
        self.dtype = dtype
        # Ignore entries may spell names as the checkpoint does (with a wrapper prefix).
        self.name_prefix = name_prefix

    def part_of(self, name: str, tensor: torch.Tensor) -> tuple[str, str] | None:
        module, _, part = name.rpartition(".")
        if part in self.required_parts:
            return module, part
        if part == "weight_zero_point":
            raise CheckpointError(f"{name}: INT4 zero points (asymmetric) are not supported")
        return None

    def decode(self, module: str, parts: dict[str, torch.Tensor]) -> Tensors:
        if self.scheme.ignores(module) or self.scheme.ignores(self.name_prefix + module):
            raise CheckpointError(
                f"{module}.weight_packed: quantization_config.ignore says {module} is not "
                "quantized, but the checkpoint stores it packed"
            )
        shape = parts["weight_shape"].flatten().tolist()
        if len(shape) != 2:
            raise CheckpointError(f"{module}.weight_shape is {shape}, expected [out, in]")
        rows, cols = int(shape[0]), int(shape[1])
        group = self.scheme.group_size or cols
        if self.keep_packed(module):
            # Validates the shapes the same way, then keeps the words as they are.
            packed, scale = parts["weight_packed"], parts["weight_scale"]
            check_packed_int4_shapes(packed, scale, (rows, cols), group, f"{module}.weight")
            yield f"{module}.weight", Int4Piece(packed, scale.to(torch.bfloat16), cols, group)
            return
        weight = dequantize_packed_int4(
            parts["weight_packed"],
            parts["weight_scale"],
            (rows, cols),
            group,
            self.dtype,
            f"{module}.weight",
        )
        yield f"{module}.weight", weight
