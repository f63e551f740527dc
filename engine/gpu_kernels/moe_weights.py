"""The routed experts' weights as the fused MoE kernel reads them: dense, FP8-block or INT4.

All experts of a layer are stacked along a leading expert dimension E, and
each expert's gate and up projections are fused into one [2I, H] matrix,
gate rows first (vLLM's `w13`); the down projection is [H, I]:

- DenseExperts:    w13 [E, 2I, H], w2 [E, H, I], in the activations' dtype.
- Fp8BlockExperts: w13 / w2 float8_e4m3fn in those shapes; `w13_scale_inv`
  [E, 2 * ceil(I/bn), ceil(H/bk)] holds the gate's block scales, then the
  up's (for I a multiple of bn, as Kimi's 2048, that is exactly the block
  grid of the fused matrix), `w2_scale_inv` [E, ceil(H/bn), ceil(I/bk)].
- Int4Experts:     compressed-tensors pack-quantized: w13_packed int32
  [E, 2I, ceil(H/8)], w13_scale [E, 2I, ceil(H/G)], w2_packed [E, H, ceil(I/8)],
  w2_scale [E, H, ceil(I/G)]; I is given, since ceil(I/8) loses it.

Each class checks its tensors against the hidden size and device it will
run with and says which tensor is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.gpu_kernels.layout import (
    DENSE,
    FLOAT_ACTS,
    FP8,
    FP8_BLOCK,
    INT4,
    INT4_VALUES_PER_WORD,
    cdiv,
    check_shape,
    check_tensor,
)
from engine.kv.quant import FP8_DTYPE


def _stack_dims(name: str, t: torch.Tensor) -> tuple[int, int, int]:
    if not isinstance(t, torch.Tensor) or t.dim() != 3:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be [experts, out, in], got {shape}")
    return tuple(t.shape)


@dataclass(frozen=True)
class DenseExperts:
    w13: torch.Tensor
    w2: torch.Tensor
    kind = DENSE

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def intermediate(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    def check(self, hidden: int, act_dtype: torch.dtype, device: torch.device) -> None:
        e, two_i, _ = _stack_dims("w13", self.w13)
        if two_i % 2:
            raise ValueError(f"w13 has {two_i} rows; gate and up need an even count")
        for name, t in (("w13", self.w13), ("w2", self.w2)):
            check_tensor(name, t, 3, FLOAT_ACTS, device)
            if t.dtype != act_dtype:
                raise ValueError(f"{name} has dtype {t.dtype}, the activations {act_dtype}")
        check_shape("w13", self.w13, (e, two_i, hidden), "[E, 2I, H]")
        check_shape("w2", self.w2, (e, hidden, two_i // 2), "[E, H, I]")


@dataclass(frozen=True)
class Fp8BlockExperts:
    w13: torch.Tensor
    w13_scale_inv: torch.Tensor
    w2: torch.Tensor
    w2_scale_inv: torch.Tensor
    block: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
    kind = FP8

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def intermediate(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    def check(self, hidden: int, act_dtype: torch.dtype, device: torch.device) -> None:
        bn, bk = self.block
        if bk < 16 or bk & (bk - 1) or bn <= 0:
            raise ValueError(f"block must be (positive, power of two >= 16), got {self.block}")
        e, two_i, _ = _stack_dims("w13", self.w13)
        if two_i % 2:
            raise ValueError(f"w13 has {two_i} rows; gate and up need an even count")
        i = two_i // 2
        for name, t in (("w13", self.w13), ("w2", self.w2)):
            check_tensor(name, t, 3, (FP8_DTYPE,), device)
        for name, t in (("w13_scale_inv", self.w13_scale_inv), ("w2_scale_inv", self.w2_scale_inv)):
            check_tensor(name, t, 3, (torch.float32,), device)
        check_shape("w13", self.w13, (e, two_i, hidden), "[E, 2I, H]")
        check_shape("w2", self.w2, (e, hidden, i), "[E, H, I]")
        check_shape("w13_scale_inv", self.w13_scale_inv, (e, 2 * cdiv(i, bn), cdiv(hidden, bk)),
                    "gate's then up's block scales")  # fmt: skip
        check_shape("w2_scale_inv", self.w2_scale_inv, (e, cdiv(hidden, bn), cdiv(i, bk)),
                    "down's block scales")  # fmt: skip


@dataclass(frozen=True)
class Int4Experts:
    w13_packed: torch.Tensor
    w13_scale: torch.Tensor
    w2_packed: torch.Tensor
    w2_scale: torch.Tensor
    intermediate: int
    group_size: int = 32
    kind = INT4

    @property
    def num_experts(self) -> int:
        return self.w13_packed.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2_packed.shape[1]

    def check(self, hidden: int, act_dtype: torch.dtype, device: torch.device) -> None:
        g, i = self.group_size, self.intermediate
        if g <= 0 or i <= 0:
            raise ValueError(f"group_size ({g}) and intermediate ({i}) must be positive")
        e, _, _ = _stack_dims("w13_packed", self.w13_packed)
        for name, t in (("w13_packed", self.w13_packed), ("w2_packed", self.w2_packed)):
            check_tensor(name, t, 3, (torch.int32,), device)
        for name, t in (("w13_scale", self.w13_scale), ("w2_scale", self.w2_scale)):
            check_tensor(name, t, 3, FLOAT_ACTS, device)
        per_word = INT4_VALUES_PER_WORD
        check_shape("w13_packed", self.w13_packed, (e, 2 * i, cdiv(hidden, per_word)),
                    "[E, 2I, H/8]: eight int4 values per int32")  # fmt: skip
        check_shape("w13_scale", self.w13_scale, (e, 2 * i, cdiv(hidden, g)), f"[E, 2I, H/{g}]")
        check_shape("w2_packed", self.w2_packed, (e, hidden, cdiv(i, per_word)),
                    "[E, H, I/8]: eight int4 values per int32")  # fmt: skip
        check_shape("w2_scale", self.w2_scale, (e, hidden, cdiv(i, g)), f"[E, H, I/{g}]")


Experts = DenseExperts | Fp8BlockExperts | Int4Experts
