"""What a BF16 model's weights become on the CPU: the plan, decided before the load,
and its application after.

On the CPU in BF16, a model is loaded in float32 first, so that weights lying on
a 4- or 8-bit grid (a quantized checkpoint's, like the default model's) can be
packed exactly before the cast (engine/layers/cpu_grid_weights.py). Packing,
and the fused decode step that follows from it (engine/execution/layer_kernels.py),
stay with one rank: the fused step runs whole layers in C without the
collectives, and packing has not been checked against sharded layers.
`--deterministic` never packs: its reductions are fixed row tiles of dense weights.

The activations' side is one choice for grid weights and for a checkpoint's
packed INT4 layers alike: int8 per group where the VNNI kernel runs, else BF16
into torch's int4 kernel (`--cpu-kernel`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.collectives import parallel
from engine.config import EngineConfig
from engine.cpu_kernels.library import unavailable as cpu_kernels_unavailable
from engine.errors import EngineError
from engine.layers.cpu_grid_weights import pack_grid_weights
from engine.layers.cpu_weight_quantization import quantize_dense_layers
from engine.layers.packed_methods import Int4GroupMethod
from engine.models.loader import cast_parameters

log = logging.getLogger(__name__)
GIB = 1024**3


@dataclass(frozen=True)
class CpuWeightPlan:
    active: bool  # the CPU's BF16 path: a CPU, BF16, not --deterministic
    packs: bool  # grid packing and the fused decode step: the BF16 path on one rank
    kernel: str  # the activations' kernel, int8 or bf16, on the BF16 path; else none

    def load_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """What to load in: float32 while grid weights are still to be found exactly."""
        return torch.float32 if self.packs else dtype

    @property
    def grid_blocks(self) -> bool:
        """A GGUF file's Q4_0/Q4_1/Q8_0 blocks go straight to the int8 grid kernel."""
        return self.packs and self.kernel == "int8"


def plan_cpu_weights(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, ranks: int
) -> CpuWeightPlan:
    active = device.type == "cpu" and dtype == torch.bfloat16 and not config.deterministic
    packs = active and ranks == 1
    if active and ranks > 1 and parallel.tp_rank() == 0:
        log.info(
            "tensor parallel: CPU packed grid weights and the fused decode step are off "
            "(the fused step would skip the collectives); the C layer ops stay on"
        )
    return CpuWeightPlan(active, packs, resolve_cpu_kernel(config.cpu_kernel) if active else "none")


def resolve_cpu_kernel(wanted: str) -> str:
    """int8 activations where the VNNI kernel runs, else torch's BF16 int4 kernel."""
    if wanted == "bf16":
        return "bf16"
    reason = cpu_kernels_unavailable()
    if not reason:
        return "int8"
    if wanted == "int8":
        raise EngineError(f"--cpu-kernel int8 cannot run here: {reason}; use bf16 or auto")
    log.info("CPU int8 grid kernel unavailable (%s); using torch's int4 kernel", reason)
    return "bf16"


def prepare_cpu_weights(
    model: torch.nn.Module, plan: CpuWeightPlan, dtype: torch.dtype, cpu_weights: str
) -> str:
    """Round, pack and cast the loaded model as `plan` says; returns the CPU kernel in
    use (int8 or bf16 when grid weights were packed or INT4 layers set, else none)."""
    if not plan.active:
        return "none"
    cpu_kernel = "none"
    if not plan.packs and cpu_weights != "checkpoint":
        log.warning(
            "--cpu-weights %s: not with tensor parallel; weights stay as loaded", cpu_weights
        )
    if plan.packs and cpu_weights != "checkpoint":
        quantized = quantize_dense_layers(model, cpu_weights)
        log.info("CPU weights: %d dense layers rounded onto %s", quantized, cpu_weights)
    if plan.packs:
        cpu_kernel = _pack_and_cast(model, dtype, plan.kernel)
    if _choose_int4_activations(model, plan.kernel):
        cpu_kernel = plan.kernel
    return cpu_kernel


def _pack_and_cast(model: torch.nn.Module, dtype: torch.dtype, cpu_kernel: str) -> str:
    """Pack grid weights (exact), then cast the model to BF16; returns the kernel used."""
    report = pack_grid_weights(model, cpu_kernel)
    cast_parameters(model, dtype)
    log.info(
        "CPU packed weights (%s activations): %d on a 4-bit grid, %d on an 8-bit grid, "
        "%d dense, %.3f GiB packed, %.3f GiB of dense copies dropped",
        cpu_kernel,
        report["4-bit"],
        report["8-bit"],
        report["dense"],
        report["packed_bytes"] / GIB,
        report["dropped_bytes"] / GIB,
    )
    return cpu_kernel


def _choose_int4_activations(model: torch.nn.Module, cpu_kernel: str) -> int:
    """The same choice for a checkpoint's packed INT4 layers as for grid weights:
    BF16 activations quantized to int8 per group (VNNI) or multiplied exactly in
    float32 (`--cpu-kernel bf16`). Returns how many layers it set."""
    count = 0
    for module in model.modules():
        method = getattr(module, "method", None)
        if isinstance(method, Int4GroupMethod):
            method.cpu_activations = "int8" if cpu_kernel == "int8" else "float"
            count += 1
    return count
