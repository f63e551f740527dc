"""Setting an engine up: what it is made of, built once and returned as one typed object.

`assemble_engine` resolves the model folder and device, starts the other
tensor-parallel ranks (first, so they load their shards meanwhile:
worker_ranks.py), builds this rank's model, pool and runner
(engine/execution/rank_model.py), then what rank 0 alone holds: the executor,
pages, prefix cache and tiers (prefix_tiers.py), speculator, scheduler and
sampler. A failure part-way stops what was already started.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.prefix_tiers import PrefixTiers, open_prefix_tiers
from engine.core.scheduler import Scheduler
from engine.core.worker_ranks import (
    abandon_other_ranks,
    close_ranks,
    start_other_ranks,
    take_compute_threads,
)
from engine.distributed.executor import LocalExecutor, MultiProcessExecutor, make_executor
from engine.distributed.launch import check_no_rank_here
from engine.execution.rank_model import RankModel, build_rank_model
from engine.host import start_up_collector
from engine.kv.pages import PageAllocator
from engine.kv.state_slots import StateSlots
from engine.layers.linear_methods import describe_methods, model_weight_bytes
from engine.model_files.store import resolve_model
from engine.sampling.sampler import Sampler
from engine.speculative import Speculator
from engine.tokenizers.loading import load_tokenizer

log = logging.getLogger(__name__)
GIB = 1024**3


@dataclass
class EngineParts:
    config: EngineConfig
    model_dir: Path
    device: torch.device
    tokenizer: Any  # the Hugging Face interface: encode, decode, chat template
    tensor_parallel: bool
    threads_before: int  # this thread's compute threads before set-up, put back on close
    rank: RankModel  # rank 0's model, KV pool and runner, and the numerics decided for them
    executor: LocalExecutor | MultiProcessExecutor
    allocator: PageAllocator
    prefix: PrefixTiers
    speculator: Speculator
    scheduler: Scheduler
    sampler: Sampler
    eos_token_ids: set[int]
    weight_bytes: int  # counted once: parameters do not change after load
    linear_methods: dict[str, int]

    def close(self) -> None:
        """Stop the KV-event publisher, if any, and the worker ranks, if any (by PID,
        after a shutdown message)."""
        self.prefix.close()
        close_ranks(self.executor, self.tensor_parallel, self.threads_before)


# Without the collector's full passes over what the build makes, which lives as long as the
# engine: ~0.1 s of a 0.85B Llama's 0.5 s build (engine/host/start_up_collector.py).
@start_up_collector.held()
def assemble_engine(config: EngineConfig) -> EngineParts:
    """Every part of an engine for `config` (see the module docstring)."""
    model_dir = resolve_model(config.model)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer(model_dir)
    tensor_parallel = config.tensor_parallel_size > 1
    check_no_rank_here(tensor_parallel)
    threads_before = take_compute_threads(device, tensor_parallel)
    # Rank 0 starts the other ranks first, so they load their shards meanwhile.
    workers = None
    if tensor_parallel:
        workers = start_other_ranks(config, model_dir, device, threads_before)
    try:
        rank = build_rank_model(config, model_dir, device)
    except BaseException as err:
        if workers is None:
            raise
        raise abandon_other_ranks(workers, err, threads_before) from err
    executor = make_executor(rank.runner, config, workers)
    prefix: PrefixTiers | None = None
    try:
        weight_bytes, linear_methods = model_weight_bytes(rank.model), describe_methods(rank.model)
        log.info(
            "weights held: %.3f GiB on this rank; linear layers: %s",
            weight_bytes / GIB,
            ", ".join(f"{n} {name}" for name, n in sorted(linear_methods.items())),
        )
        allocator = PageAllocator(rank.pool.num_pages)
        prefix = open_prefix_tiers(config, rank, allocator, model_dir, device, tensor_parallel)
        speculator = Speculator(
            config.speculative,
            config.speculative_max_draft,
            rank.max_model_len,
            proposer=_mtp_proposer(config, rank, allocator),
        )
        recurrent = rank.state_pool is not None
        scheduler = Scheduler(
            allocator,
            config.page_size,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            prefix_cache=prefix.cache,
            max_waiting=config.max_waiting,
            # A recurrent state cannot take back a rejected draft token: no speculation.
            speculator=None if recurrent else speculator,
            restore=prefix.restore_hook,  # spilled pages come back before a prompt's reuse
            state_slots=StateSlots(rank.state_pool.num_slots) if recurrent else None,
        )
        return EngineParts(
            config=config,
            model_dir=model_dir,
            device=device,
            tokenizer=tokenizer,
            tensor_parallel=tensor_parallel,
            threads_before=threads_before,
            rank=rank,
            executor=executor,
            allocator=allocator,
            prefix=prefix,
            speculator=speculator,
            scheduler=scheduler,
            sampler=Sampler(config.seed),
            eos_token_ids=eos_token_ids(model_dir, tokenizer),
            weight_bytes=weight_bytes,
            linear_methods=linear_methods,
        )
    except BaseException:
        if prefix is not None:
            prefix.close()
        close_ranks(executor, tensor_parallel, threads_before)
        raise


def _mtp_proposer(config: EngineConfig, rank: RankModel, allocator: PageAllocator):
    """The MTP draft over the model's MTP layers with --speculative mtp, else None."""
    if config.speculative != "mtp":
        return None
    from engine.speculative.mtp_proposer import MTPProposer

    return MTPProposer(rank.runner, allocator, config.speculative_mtp_tokens)


def eos_token_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """The tokens generation stops on: generation_config.json's and the tokenizer's."""
    ids: set[int] = set()
    gen_config = model_dir / "generation_config.json"
    if gen_config.is_file():
        value = json.loads(gen_config.read_text()).get("eos_token_id")
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
