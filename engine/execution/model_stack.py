"""One rank's model, KV pool and runner: what rank 0 (LLMEngine) and every worker build alike.

`build_model_stack` loads the model (this rank's shard once the process has
joined a tensor-parallel group: engine.collectives.parallel), sets up the K/V
rotation, the CPU weight packing or deterministic reductions, sizes and
allocates the KV pool and makes the ModelRunner. Everything that decides what
a forward step computes is here, so every rank computes the same step.

With more than one rank, the ranks agree before allocating: the facts that
must match (architecture, dtypes, page size, context length) are compared,
and the pool takes the smallest page count any rank can hold, because page
tables are global (rank 0 schedules pages for all).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.attention.registry import get_backend
from engine.collectives import parallel
from engine.config import DEFAULT_CPU_KV_GIB, EngineConfig
from engine.cpu_kernels.library import unavailable as cpu_kernels_unavailable
from engine.errors import EngineError, KVCapacityError
from engine.execution.runner import ModelRunner
from engine.kv.dtypes import AUTO_KV_DTYPES
from engine.kv.pool import PagedKVPool
from engine.kv.pools import make_pool
from engine.kv.scales import apply_fixed_scales, read_scales_file, resolve_rotation
from engine.kv.sizing import KVLayout, capacity_tokens, kv_bytes_per_token
from engine.layers.batch_invariant import make_linear_layers_batch_invariant
from engine.layers.cpu_grid_weights import pack_grid_weights
from engine.layers.cpu_moe_block import use_cpu_moe_blocks
from engine.layers.cpu_moe_experts import use_cpu_moe_experts
from engine.layers.cpu_weight_quantization import quantize_dense_layers
from engine.layers.layer_ops import CPU_LAYER_OPS
from engine.layers.packed_methods import Int4GroupMethod
from engine.model_files.model_config import load_config
from engine.models.cpu_decode_step import fused_decode_for
from engine.models.loader import cast_parameters, load_model

log = logging.getLogger(__name__)
GIB = 1024**3


def resolve_dtype(name: str, config_dtype: str | None, device: torch.device) -> torch.dtype:
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if config_dtype in ("float32", "torch.float32"):
        return torch.float32
    return torch.bfloat16


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> str:
    """The KV storage dtype `kv_cache_dtype` names; "auto" keeps the model's dtype
    (engine.kv.dtypes.AUTO_KV_DTYPES: a float32 model keeps a float32 cache)."""
    if name == "auto":
        return AUTO_KV_DTYPES[str(model_dtype).removeprefix("torch.")]
    return name


@dataclass
class ModelStack:
    model: torch.nn.Module
    model_config: object  # engine.model_files.model_config.ModelConfig
    dtype: torch.dtype
    kv_dtype: str
    max_model_len: int
    layout: KVLayout  # this rank's KV layout (its share of the KV heads)
    kv_rotation: str
    kv_rotation_detail: str
    kv_scales_file: dict | None
    cpu_kernel: str  # int8 or bf16 when CPU grid weights were packed, else none
    pool: PagedKVPool
    runner: ModelRunner


def build_model_stack(config: EngineConfig, model_dir: Path, device: torch.device) -> ModelStack:
    """This rank's model, KV pool and runner (see the module docstring)."""
    ranks = parallel.tp_size()
    model_cfg = load_config(model_dir)
    dtype = resolve_dtype(config.dtype, model_cfg.torch_dtype_name, device)
    # CPU, BF16: load in float32 first, so that weights lying on a 4- or 8-bit grid
    # (a quantized checkpoint's, like the default model's) can be packed exactly
    # before the cast (engine/layers/cpu_grid_weights.py). The C layer ops run at
    # any rank count: they are operators the modules call, and the modules keep
    # their all-reduces. Grid packing and the fused decode step stay with one rank:
    # the fused step runs whole layers in C without the collectives, and packing
    # has not been checked against sharded layers.
    cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16 and not config.deterministic
    packs = cpu_bf16 and ranks == 1
    if cpu_bf16 and ranks > 1 and parallel.tp_rank() == 0:
        log.info(
            "tensor parallel: CPU packed grid weights and the fused decode step are off "
            "(the fused step would skip the collectives); the C layer ops stay on"
        )
    wanted_kernel = _resolve_cpu_kernel(config.cpu_kernel) if cpu_bf16 else "none"
    model, model_config, ckpt_scales = load_model(
        model_dir,
        torch.float32 if packs else dtype,
        device,
        keep_packed=config.quantized_weights == "packed",
        # A GGUF file's Q4_0/Q4_1/Q8_0 blocks go straight to the int8 grid kernel.
        grid_blocks=packs and wanted_kernel == "int8",
    )
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, dtype)
    max_model_len = config.max_model_len or model_config.max_position_embeddings
    if max_model_len > model_config.max_position_embeddings:
        raise EngineError(
            f"max_model_len {max_model_len} exceeds the model's "
            f"max_position_embeddings {model_config.max_position_embeddings}"
        )
    if ranks > 1:
        from engine.collectives.agreement import check_same_on_all_ranks

        check_same_on_all_ranks(
            {
                "architecture": model_config.architecture,
                "layers": model_config.num_layers,
                "vocab_size": model_config.vocab_size,
                "dtype": str(dtype),
                "kv_cache_dtype": kv_dtype,
                "page_size": config.page_size,
                "max_model_len": max_model_len,
            }
        )
    layout = model.kv_layout()
    kv_scales_file = (
        read_scales_file(config.kv_scales_file, layout.kind) if config.kv_scales_file else None
    )
    kv_rotation = resolve_rotation(
        config.kv_rotation, kv_dtype, kv_scales_file, ckpt_scales is not None
    )
    # For MLA the rotation folds into the weights: before anything packs or copies them.
    kv_rotation_detail = ""
    if kv_rotation == "hadamard":
        kv_rotation_detail = model.enable_kv_rotation(config.deterministic)
        log.info("KV rotation: hadamard (%s)", kv_rotation_detail)
    cpu_kernel = "none"
    if cpu_bf16:
        if not packs and config.cpu_weights != "checkpoint":
            log.warning(
                "--cpu-weights %s: not with tensor parallel; weights stay as loaded",
                config.cpu_weights,
            )
        if packs and config.cpu_weights != "checkpoint":
            quantized = quantize_dense_layers(model, config.cpu_weights)
            log.info("CPU weights: %d dense layers rounded onto %s", quantized, config.cpu_weights)
        if packs:
            cpu_kernel = _pack_and_cast(model, dtype, wanted_kernel)
        if _choose_int4_activations(model, wanted_kernel):
            cpu_kernel = wanted_kernel
    if cpu_bf16:
        _use_cpu_layer_kernels(model, fuse_decode=ranks == 1)
    if device.type == "cuda" and not config.deterministic:
        _use_gpu_layer_kernels(model)
    if config.deterministic:
        _enable_deterministic(model, model_config)
    pool = _build_pool(
        config, layout, kv_dtype, max_model_len, device, kv_rotation, kv_scales_file, ckpt_scales
    )
    runner = ModelRunner(
        model,
        pool,
        get_backend(config.attention_backend, config.deterministic),
        config.page_size,
        device,
    )
    if not config.fp8_decode_dots and hasattr(runner.backend, "fp8_dot"):
        runner.backend.fp8_dot = False  # the Triton backend's default takes them where it can
    if config.cuda_graphs and ranks == 1 and _graphs_can_run(runner):
        # Here, not at the top: the graphs' inputs are the Triton kernels' page tables,
        # and Triton is installed only where it runs (Linux x86-64).
        from engine.execution.decode_graphs import DecodeGraphs
        from engine.execution.decode_inputs import DecodeInputs

        runner.graphs = DecodeGraphs(
            model,
            pool,
            runner.backend,
            DecodeInputs(config.max_num_seqs, max_model_len, config.page_size, device),
            capture=True,
        )
    return ModelStack(
        model=model,
        model_config=model_config,
        dtype=dtype,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        layout=layout,
        kv_rotation=kv_rotation,
        kv_rotation_detail=kv_rotation_detail,
        kv_scales_file=kv_scales_file,
        cpu_kernel=cpu_kernel,
        pool=pool,
        runner=runner,
    )


def _kv_budget_bytes(
    config: EngineConfig, device: torch.device, max_model_len: int, per_token: int
) -> int:
    if config.kv_memory_gib is not None:
        return int(config.kv_memory_gib * GIB)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.85)
    # Enough for the default CPU budget, and always for one full-length sequence.
    return max(int(DEFAULT_CPU_KV_GIB * GIB), 2 * max_model_len * per_token)


def _resolve_cpu_kernel(wanted: str) -> str:
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


def _use_cpu_layer_kernels(model: torch.nn.Module, fuse_decode: bool) -> None:
    """Norms, rotary, SwiGLU and K/V rotations through the C layer ops, and with
    `fuse_decode` (one rank) whole decode steps and each MoE layer's routed experts
    in one C call, where the kernels run; the model's torch ops otherwise. Chosen
    here once: the modules call what they hold."""
    if cpu_kernels_unavailable():
        return
    routed = model.use_layer_ops(CPU_LAYER_OPS)
    if fuse_decode:  # before the fused step, which takes each MoE layer's C form
        routed["fused MoE experts"] = use_cpu_moe_experts(model)
        routed["fused MoE layers"] = use_cpu_moe_blocks(model)
    fused = fused_decode_for(model) if fuse_decode else None
    if fused is not None:
        model.model.decode_step = fused
    routed["fused decode"] = int(fused is not None)
    log.info("CPU layer kernels: %s", ", ".join(f"{n} {k}" for k, n in routed.items()))


def _use_gpu_layer_kernels(model: torch.nn.Module) -> None:
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


def _graphs_can_run(runner: ModelRunner) -> bool:
    """CUDA graphs replay decode on a GPU whose attention is the Triton backend (the
    torch and deterministic backends build masks and tables on the host each step)."""
    return runner.device.type == "cuda" and runner.backend.name == "triton"


def _enable_deterministic(model: torch.nn.Module, model_config) -> None:
    if not getattr(model, "supports_deterministic", False):
        raise EngineError(
            f"--deterministic is implemented for dense GQA models (Llama, Qwen2, GLM-4); "
            f"{model_config.architecture} is not one yet"
        )
    try:
        make_linear_layers_batch_invariant(model)
    except ValueError as err:
        raise EngineError(f"--deterministic: {err}") from None


def _build_pool(
    config: EngineConfig,
    layout: KVLayout,
    kv_dtype: str,
    max_model_len: int,
    device: torch.device,
    kv_rotation: str,
    kv_scales_file: dict | None,
    ckpt_scales,
) -> PagedKVPool:
    page = config.page_size
    per_token = kv_bytes_per_token(layout, kv_dtype)
    budget = _kv_budget_bytes(config, device, max_model_len, per_token)
    num_pages = capacity_tokens(budget, layout, kv_dtype, page) // page
    if parallel.tp_size() > 1:
        from engine.collectives.agreement import min_over_ranks

        # Page tables are global: every rank holds the pages the smallest can.
        num_pages = min_over_ranks(num_pages)
    capacity = num_pages * page
    if capacity < max_model_len:
        raise KVCapacityError(
            f"the KV budget of {budget / GIB:.3f} GiB holds {capacity} tokens "
            f"({per_token} bytes/token in {kv_dtype}), less than one sequence of "
            f"max_model_len={max_model_len}; raise --kv-memory to at least "
            f"{max_model_len * per_token / GIB:.3f} GiB or lower --max-model-len"
        )
    per_head = config.kv_scales_per_head
    pool = make_pool(layout, num_pages, page, kv_dtype, device, per_head)
    apply_fixed_scales(pool, kv_rotation, kv_scales_file, ckpt_scales, per_head)
    log.info(
        "KV cache: %s, %d pages of %d tokens = %d tokens, %.3f GiB, scales from %s",
        kv_dtype,
        num_pages,
        page,
        capacity,
        pool.nbytes / GIB,
        pool.scale_source,
    )
    return pool
