"""How a model's small per-layer operators compute: an object the modules call, chosen at load.

RMSNorm, the decoder layer's residual add and second norm, SwiGLU, the rotary
embedding and the K/V Hadamard rotation each call `self.ops.<op>(...)`:

- `TorchLayerOps` (every module's default): the reference arithmetic, with
  transformers' rounding points; any device, any dtype.
- `CpuLayerOps`: one C call per operator (engine/cpu_kernels/layer_ops.c)
  where the tensors are BF16 on the CPU in a layout the kernels take, with
  the same rounding points; any other call goes to the torch reference.
- `GpuLayerOps` (engine/layers/gpu_layer_ops.py): one Triton kernel per
  operator for CUDA tensors (engine/gpu_kernels/layer_ops.py), likewise.

A decode step of a small model on CPU spends as much time in these operators,
several tiny torch calls each, as in its weight products; the C versions make
one call each. The engine chooses once at load (`CausalLM.use_layer_ops`,
called from engine/execution/layer_kernels.py) and nothing else changes: the modules keep
their forward, the collectives in it included, so the ops are safe with
tensor parallelism. `--deterministic` keeps the torch ops.

The ops object is an attribute of each module, the way a linear layer owns
its method, rather than a field of the ForwardContext: norms, MLPs and
rotations are called without a context (MoE experts, MLA's latent norm), and
the choice belongs to the loaded model, not to a step.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.cpu_kernels import layer_ops as kernels
from engine.layers.activation import silu_and_mul


class RotaryTables(Protocol):
    """What the ops read of a rotary embedding (engine/layers/rotary.py RotaryEmbedding)."""

    rotary_dim: int
    interleaved: bool
    cos: torch.Tensor
    sin: torch.Tensor

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype, step_cache: dict | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class BlockRotation(Protocol):
    """What the ops read of a Hadamard rotation (engine/kv/rotation.py HadamardRotation):
    its size, its block, and its float32 torch product."""

    dim: int
    block: int

    def product(self, x: torch.Tensor) -> torch.Tensor: ...


class TorchLayerOps:
    """The reference: what transformers computes, operator by operator."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Normalise in float32, scale in the input dtype (transformers' rounding points)."""
        input_dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(input_dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + x, its norm): a decoder layer's residual add and the norm after it."""
        residual = residual + x
        return residual, self.rms_norm(residual, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU on a fused [gate | up] tensor."""
        return silu_and_mul(gate_up)

    def rope_(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryTables,
        step_cache: dict | None,
    ) -> None:
        """Rotate x [tokens, heads, head_dim] in place by `rotary`'s tables."""
        cos, sin = rotary.tables(positions, x.dtype, step_cache)
        rot = x[..., : rotary.rotary_dim]
        if rotary.interleaved:
            first, second = rot[..., 0::2], rot[..., 1::2]
        else:
            half = rotary.rotary_dim // 2
            first, second = rot[..., :half], rot[..., half:]
        new_first = first * cos - second * sin
        new_second = second * cos + first * sin
        first.copy_(new_first)
        second.copy_(new_second)

    def hadamard(self, x: torch.Tensor, rotation: BlockRotation) -> torch.Tensor:
        """x @ blockdiag(H) over the last dim: the rotation's own float32 product."""
        return rotation.product(x)


def _bf16_cpu(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16 and x.device.type == "cpu"


class CpuLayerOps(TorchLayerOps):
    """The C kernels for BF16 CPU tensors; each call the kernels cannot take (another
    dtype or device, a layout they do not read) runs the torch reference instead."""

    name = "cpu"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if _bf16_cpu(x) and weight.dtype == torch.bfloat16:
            return kernels.rms_norm(x, weight, eps)
        return super().rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not (_bf16_cpu(residual) and _bf16_cpu(x) and weight.dtype == torch.bfloat16):
            return super().add_rms_norm(x, residual, weight, eps)
        # The kernel adds x into the residual in place: give it a copy of its own.
        residual = residual.clone(memory_format=torch.contiguous_format)
        normed = kernels.rms_norm(x, weight, eps, residual=residual)
        return residual, normed

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if _bf16_cpu(gate_up):
            return kernels.silu_mul(gate_up)
        return super().silu_mul(gate_up)

    def rope_(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryTables,
        step_cache: dict | None,
    ) -> None:
        # The kernel reads each head's values contiguous, heads at one stride: q and k of a
        # fused qkv, and MLA's q_rope (the tail of each q head) as it lies.
        if not (
            _bf16_cpu(x)
            and x.dim() == 3
            and x.stride(2) == 1
            and (x.stride(1) >= x.shape[2] or x.shape[1] == 1)
        ):
            return super().rope_(x, positions, rotary, step_cache)
        positions = positions if positions.dtype == torch.int64 else positions.long()
        kernels.rope_(
            x, positions.contiguous(), rotary.cos, rotary.sin, rotary.rotary_dim, rotary.interleaved
        )

    def hadamard(self, x: torch.Tensor, rotation: BlockRotation) -> torch.Tensor:
        block = rotation.block
        if not (
            _bf16_cpu(x) and x.dim() >= 2 and x.shape[-1] == rotation.dim and x.numel() > 0
        ) or block & (block - 1):
            return super().hadamard(x, rotation)
        return kernels.hadamard_(x.contiguous().clone(), block)


TORCH_LAYER_OPS = TorchLayerOps()
CPU_LAYER_OPS = CpuLayerOps()
