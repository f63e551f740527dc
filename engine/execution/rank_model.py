"""One rank's model, KV pool and runner: what rank 0 (LLMEngine) and every worker build alike.

`build_rank_model` composes the decisions that fix what a forward step computes,
each named and kept with its concern, so every rank computes the same step:

- the activation dtype (`resolve_dtype`, below) and the KV cache's
  (engine/kv/dtypes.py);
- the K/V rotation and fixed scales (engine/kv/scales.py), applied to the model;
- what the CPU does with BF16 weights (engine/execution/weight_packing.py) and
  which kernels the layers run (engine/execution/layer_kernels.py);
- the KV pool's size (engine/kv/pool_budget.py), after a hybrid model's
  recurrent states (one per sequence that may run: engine/kv/state_pool.py,
  and the prefix cache's snapshots of them: engine/kv/state_budget.py);
- the attention backend and CUDA graphs (engine/execution/runner.py).

With more than one rank, the ranks agree before allocating: the facts that
must match (architecture, dtypes, page size, context length) are compared,
and the pool takes the smallest page count any rank can hold, because page
tables are global (rank 0 schedules pages for all).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
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
from engine.kv.pool_budget import allocate_kv_pool, kv_budget_bytes
from engine.kv.recurrent_state import RecurrentStateLayout
from engine.kv.scales import read_scales_file, resolve_rotation
from engine.kv.sizing import KVLayout, kv_bytes_per_token
from engine.kv.state_budget import StateBudget, plan_state_budget
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
    # A hybrid model's per-sequence recurrent states (Kimi Linear's KDA layers), else None,
    # and the prefix cache's snapshots of them (None without prefix caching or room).
    state_pool: RecurrentStatePool | None = None
    snapshot_pool: RecurrentStatePool | None = None


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
    load_mtp = config.speculative == "mtp"
    if load_mtp and ranks > 1:
        # The draft runs on rank 0 between steps (engine/speculative/mtp_proposer.py).
        raise EngineError("--speculative mtp runs on one rank; use --tp 1 or prompt_lookup")
    model, model_config, ckpt_scales = load_model(
        model_dir,
        cpu.load_dtype(dtype),
        device,
        keep_packed=config.quantized_weights == "packed",
        grid_blocks=cpu.grid_blocks,
        load_mtp=load_mtp,
    )
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, dtype)
    max_model_len = _context_length(config, model_config)
    if ranks > 1:
        _agree_across_ranks(config, model_config, dtype, kv_dtype, max_model_len)
    layout = model.kv_layout()
    if load_mtp:  # the MTP layers' KV: more layers of the same pages (engine/models/mtp.py)
        layout = model.mtp.grow_kv_layout(layout)
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
    states = None
    if state_layout is not None:
        states = _state_budget(config, state_layout, dtype, layout, kv_dtype, max_model_len, device)
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
        reserved_bytes=states.reserved_bytes if states is not None else 0,
    )
    state_pool = snapshot_pool = None
    if states is not None:
        state_pool = allocate_state_pool(state_layout, states.running_slots, dtype, device)
        if states.snapshot_entries:
            snapshot_pool = allocate_state_pool(
                state_layout, states.snapshot_entries, dtype, device, "prefix-cache state snapshots"
            )
    runner = build_runner(
        model, pool, config, device, ranks, max_model_len, state_pool, snapshot_pool
    )
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
        snapshot_pool=snapshot_pool,
    )


def _state_budget(
    config: EngineConfig,
    state_layout: RecurrentStateLayout,
    dtype: torch.dtype,
    layout: KVLayout,
    kv_dtype: str,
    max_model_len: int,
    device: torch.device,
) -> StateBudget:
    """A hybrid model's running states and prefix-cache snapshots, out of the KV budget.
    With tensor parallelism every rank keeps the same snapshot entries (rank 0's
    scheduler names them in each step, engine/distributed/step.py), each for its own
    heads: the smallest count any rank has room for."""
    per_token = kv_bytes_per_token(layout, kv_dtype)
    budget = kv_budget_bytes(
        config.kv_memory_gib, device, max_model_len, per_token, DEFAULT_CPU_KV_GIB
    )
    page = config.page_size
    one_sequence = -(-max_model_len // page) * page * per_token
    states = plan_state_budget(
        state_layout, dtype, config.max_num_seqs, budget, one_sequence, config.enable_prefix_caching
    )
    if parallel.tp_size() > 1:
        from engine.collectives.agreement import min_over_ranks

        states = replace(states, snapshot_entries=min_over_ranks(states.snapshot_entries))
    return states


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
