"""`GpuLayerOps`: the Triton kernels (engine/gpu_kernels/layer_ops.py) for a model on a GPU.

RMSNorm, the residual add with the norm after it, SwiGLU and the rotary
embedding each become one kernel launch instead of several torch operators,
with TorchLayerOps' rounding points (the kernels' module says where they can
differ). Each call the kernels cannot take runs the torch reference instead,
as CpuLayerOps does: tensors that are not on a GPU, dtypes other than
bfloat16, float16 and float32, a norm weight in another dtype than its input,
rows wider than the kernel's registers, a last dimension with a stride.

The engine chooses these ops once at load on a CUDA device
(engine/execution/layer_kernels.py) unless `--deterministic` keeps the torch
ops. The Hadamard rotation stays torch's matrix product. Importing this
module does not import Triton: the kernels are imported on the first call
that runs them.
"""

from __future__ import annotations

import functools

import torch

from engine.attention.triton.target import on_gpu
from engine.layers.layer_ops import RotaryTables, TorchLayerOps

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_NORM_WIDTH = 16384  # engine.gpu_kernels.layer_ops.MAX_NORM_WIDTH, without importing Triton


@functools.cache
def _kernels():
    from engine.gpu_kernels import layer_ops

    return layer_ops


def _kernel_device(t: torch.Tensor) -> bool:
    """Where the kernels run: a CUDA tensor (or a meta one while the compile check plans)."""
    return on_gpu(t)


def _takes(t: torch.Tensor) -> bool:
    return _kernel_device(t) and t.dtype in KERNEL_DTYPES and t.dim() > 0 and t.stride(-1) == 1


def _norm_inputs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    width = x.shape[-1] if x.dim() else 0
    return (
        _takes(x)
        and weight.dtype == x.dtype
        and weight.device == x.device
        and weight.shape == (width,)
        and weight.stride(0) == 1
        and 0 < width <= MAX_NORM_WIDTH
    )


class GpuLayerOps(TorchLayerOps):
    """The Triton kernels for GPU tensors; the torch reference for every other call."""

    name = "gpu"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if _norm_inputs(x, weight):
            return _kernels().rms_norm(x, weight, eps)
        return super().rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The kernel writes residual + x to a new tensor: the caller's residual is only read.
        if (
            _norm_inputs(x, weight)
            and _takes(residual)
            and residual.shape == x.shape
            and residual.dtype == x.dtype
            and residual.device == x.device
        ):
            return _kernels().rms_norm(x, weight, eps, residual=residual)
        return super().add_rms_norm(x, residual, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if _takes(gate_up) and gate_up.shape[-1] % 2 == 0:
            return _kernels().silu_mul(gate_up)
        return super().silu_mul(gate_up)

    def rope_(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryTables,
        step_cache: dict | None,
    ) -> None:
        # The kernel reads the tables at each token's position itself, so the step
        # cache of looked-up rows is not needed.
        cos, sin = rotary.cos, rotary.sin
        if not (
            _takes(x)
            and x.dim() == 3
            and positions.shape == (x.shape[0],)
            and positions.dtype in (torch.int32, torch.int64)
            and positions.device == x.device
            and cos.device == x.device
            and cos.dtype in KERNEL_DTYPES
            and cos.stride() == sin.stride()
            and cos.stride(-1) == 1
            and rotary.rotary_dim % 2 == 0
            and 0 < rotary.rotary_dim <= x.shape[2]
        ):
            return super().rope_(x, positions, rotary, step_cache)
        _kernels().rope_(x, positions, cos, sin, rotary.rotary_dim, rotary.interleaved)


GPU_LAYER_OPS = GpuLayerOps()
