"""Which kernels a loaded model's layers run, chosen once at load: the modules call
what they hold.

- CPU, BF16 path: norms, rotary, SwiGLU and the K/V rotations through the C
  layer ops (engine/layers/layer_ops.py), at any rank count (they are operators
  the modules call, and the modules keep their all-reduces); with one rank also
  each MoE layer's routed experts and whole decode steps in one C call.
- GPU: the same as one Triton kernel each (engine/layers/gpu_layer_ops.py),
  unless `--deterministic` keeps the torch ops.
- `--deterministic`: batch-invariant linear layers (engine/layers/batch_invariant.py).
Where the kernels cannot run, the model's torch ops stay.
"""

from __future__ import annotations

import logging

import torch

from engine.cpu_kernels.library import unavailable as cpu_kernels_unavailable
from engine.errors import EngineError
from engine.execution.weight_packing import CpuWeightPlan
from engine.layers.batch_invariant import make_linear_layers_batch_invariant
from engine.layers.cpu_moe_block import use_cpu_moe_blocks
from engine.layers.cpu_moe_experts import use_cpu_moe_experts
from engine.layers.layer_ops import CPU_LAYER_OPS
from engine.model_files.model_config import ModelConfig
from engine.models.cpu_decode_step import fused_decode_for

log = logging.getLogger(__name__)


def choose_layer_kernels(
    model: torch.nn.Module,
    model_config: ModelConfig,
    cpu: CpuWeightPlan,
    device: torch.device,
    deterministic: bool,
) -> None:
    """Route the model's layers to the kernels this device runs (module docstring)."""
    if cpu.active:
        # The fused decode step goes with packing: one rank (engine/execution/weight_packing.py).
        use_cpu_layer_kernels(model, fuse_decode=cpu.packs)
    if device.type == "cuda" and not deterministic:
        use_gpu_layer_kernels(model)
    if deterministic:
        make_deterministic(model, model_config)


def use_cpu_layer_kernels(model: torch.nn.Module, fuse_decode: bool) -> None:
    """Norms, rotary, SwiGLU and K/V rotations through the C layer ops, and with
    `fuse_decode` (one rank) whole decode steps and each MoE layer's routed experts
    in one C call, where the kernels run; the model's torch ops otherwise."""
    if cpu_kernels_unavailable():
        return
    routed = model.use_layer_ops(CPU_LAYER_OPS)
    if fuse_decode:  # before the fused step, which takes each MoE layer's C form
        routed["fused MoE experts"] = use_cpu_moe_experts(model)
        routed["fused MoE layers"] = use_cpu_moe_blocks(model)
    fused = fused_decode_for(model) if fuse_decode else None
    if fused is not None:
        model.use_decode_step(fused)
    routed["fused decode"] = int(fused is not None)
    log.info("CPU layer kernels: %s", ", ".join(f"{n} {k}" for k, n in routed.items()))


def use_gpu_layer_kernels(model: torch.nn.Module) -> None:
    """Norms, the residual add, SwiGLU and rotary as one Triton kernel each
    (engine/layers/gpu_layer_ops.py); the torch ops where Triton cannot run."""
    from engine.attention.triton import triton_available, triton_version_problem

    problem = "triton is not installed" if not triton_available() else triton_version_problem()
    if problem:
        log.info("GPU layer kernels off (%s): norms, SwiGLU and rotary run as torch ops", problem)
        return
    from engine.layers.gpu_layer_ops import GPU_LAYER_OPS

    routed = model.use_layer_ops(GPU_LAYER_OPS)
    log.info("GPU layer kernels (Triton): %s", ", ".join(f"{n} {k}" for k, n in routed.items()))


def make_deterministic(model: torch.nn.Module, model_config: ModelConfig) -> None:
    """Batch-invariant linear layers: the same logits whatever else shares the batch."""
    if not getattr(model, "supports_deterministic", False):
        raise EngineError(
            f"--deterministic is implemented for dense GQA models (Llama, Qwen2, GLM-4); "
            f"{model_config.architecture} is not one yet"
        )
    try:
        make_linear_layers_batch_invariant(model)
    except ValueError as err:
        raise EngineError(f"--deterministic: {err}") from None
