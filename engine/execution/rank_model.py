"""One rank's model, KV pool and runner: what rank 0 (LLMEngine) and every worker build alike.

`build_rank_model` composes the decisions that fix what a forward step computes,
each named and kept with its concern, so every rank computes the same step:

- the activation dtype (`resolve_dtype`, below) and the KV cache's
  (engine/kv/dtypes.py);
- the K/V rotation and fixed scales (engine/kv/scales.py), applied to the model;
- what the CPU does with BF16 weights (engine/execution/weight_packing.py) and
  which kernels the layers run (engine/execution/layer_kernels.py);
- the KV pool's size (engine/kv/pool_budget.py), after a hybrid model's
  recurrent states (one per sequence that may run: engine/kv/state_pool.py);
- the attention backend and CUDA graphs (engine/execution/runner.py).

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

from engine.collectives import parallel
from engine.config import DEFAULT_CPU_KV_GIB, EngineConfig
from engine.errors import EngineError
from engine.execution.layer_kernels import choose_layer_kernels
from engine.execution.runner import ModelRunner, build_runner
from engine.execution.weight_packing import plan_cpu_weights, prepare_cpu_weights
from engine.host.memory_advice import return_free_memory
from engine.kv.dtypes import resolve_kv_dtype
from engine.kv.pool import PagedKVPool
from engine.kv.pool_budget import allocate_kv_pool
from engine.kv.scales import read_scales_file, resolve_rotation
from engine.kv.sizing import KVLayout
from engine.kv.state_pool import RecurrentStatePool, allocate_state_pool, state_layout_of
from engine.model_files.model_config import ModelConfig, load_config
from engine.models.loader import load_model

log = logging.getLogger(__name__)


@dataclass
class RankModel:
    model: torch.nn.Module
    model_config: ModelConfig
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
    # A hybrid model's per-sequence recurrent states (Kimi Linear's KDA layers), else None.
    state_pool: RecurrentStatePool | None = None


def resolve_dtype(name: str, config_dtype: str | None, device: torch.device) -> torch.dtype:
    """The activations' dtype: `--dtype`, or for auto float32 only where the
    checkpoint says so, else BF16."""
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if config_dtype in ("float32", "torch.float32"):
        return torch.float32
    return torch.bfloat16


def build_rank_model(config: EngineConfig, model_dir: Path, device: torch.device) -> RankModel:
    """This rank's model, KV pool and runner (see the module docstring)."""
    ranks = parallel.tp_size()
    dtype = resolve_dtype(config.dtype, load_config(model_dir).torch_dtype_name, device)
    cpu = plan_cpu_weights(config, device, dtype, ranks)
    model, model_config, ckpt_scales = load_model(
        model_dir,
        cpu.load_dtype(dtype),
        device,
        keep_packed=config.quantized_weights == "packed",
        grid_blocks=cpu.grid_blocks,
    )
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, dtype)
    max_model_len = _context_length(config, model_config)
    if ranks > 1:
        _agree_across_ranks(config, model_config, dtype, kv_dtype, max_model_len)
    layout = model.kv_layout()
    kv_scales_file = (
        read_scales_file(config.kv_scales_file, layout.kind) if config.kv_scales_file else None
    )
    kv_rotation = resolve_rotation(
        config.kv_rotation, kv_dtype, kv_scales_file, ckpt_scales is not None
    )
    # For MLA the rotation folds into the weights: before anything packs or copies them.
    kv_rotation_detail = _rotate_kv(model, kv_rotation, config.deterministic)
    return_free_memory()  # loading's float copies, before the cast allocates BF16 ones
    cpu_kernel = prepare_cpu_weights(model, cpu, dtype, config.cpu_weights)
    choose_layer_kernels(model, model_config, cpu, device, config.deterministic)
    return_free_memory()  # the float copies loading, rotating and packing freed
    state_layout = state_layout_of(model)
    state_bytes = 0
    if state_layout is not None:
        state_bytes = RecurrentStatePool.bytes_for(state_layout, config.max_num_seqs, dtype)
    pool = allocate_kv_pool(
        layout,
        kv_dtype,
        page_size=config.page_size,
        max_model_len=max_model_len,
        device=device,
        kv_memory_gib=config.kv_memory_gib,
        cpu_default_gib=DEFAULT_CPU_KV_GIB,
        per_head=config.kv_scales_per_head,
        rotation=kv_rotation,
        scales_file=kv_scales_file,
        ckpt_scales=ckpt_scales,
        reserved_bytes=state_bytes,
    )
    state_pool = None
    if state_layout is not None:
        state_pool = allocate_state_pool(state_layout, config.max_num_seqs, dtype, device)
    runner = build_runner(model, pool, config, device, ranks, max_model_len, state_pool)
    return RankModel(
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
        state_pool=state_pool,
    )


def _context_length(config: EngineConfig, model_config: ModelConfig) -> int:
    """`max_model_len`, by default the model's own, never past it."""
    max_model_len = config.max_model_len or model_config.max_position_embeddings
    if max_model_len > model_config.max_position_embeddings:
        raise EngineError(
            f"max_model_len {max_model_len} exceeds the model's "
            f"max_position_embeddings {model_config.max_position_embeddings}"
        )
    return max_model_len


def _agree_across_ranks(
    config: EngineConfig,
    model_config: ModelConfig,
    dtype: torch.dtype,
    kv_dtype: str,
    max_model_len: int,
) -> None:
    """Every rank must compute the same step: compare what decides it before allocating."""
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


def _rotate_kv(model: torch.nn.Module, kv_rotation: str, deterministic: bool) -> str:
    """Rotate K and V before the cache when the rotation is hadamard; says what is used."""
    if kv_rotation != "hadamard":
        return ""
    detail = model.enable_kv_rotation(deterministic)
    log.info("KV rotation: hadamard (%s)", detail)
    return detail
