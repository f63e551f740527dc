"""The other tensor-parallel ranks as rank 0 sees them, and this thread's compute threads.

Rank 0 starts the other ranks before it loads its own shard, so they load
theirs meanwhile; a load that fails abandons them; closing the engine stops
them. A single-rank CPU engine takes every usable core (engine.host.threads);
with ranks, they split the cores themselves (engine.distributed.launch), and
this thread's count before set-up is put back when they stop.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.distributed.executor import LocalExecutor, MultiProcessExecutor
from engine.distributed.launch import WorkerProcess, abandon_ranks, start_ranks
from engine.errors import EngineError
from engine.host.cpu_features import describe_cpu
from engine.host.threads import fit_to_usable_cores
from engine.layers.cpu_matrix_path import describe_matrix_path

log = logging.getLogger(__name__)


def take_compute_threads(device: torch.device, tensor_parallel: bool) -> int:
    """Size this thread's compute team for a single-rank CPU engine; returns the count
    it had before (put back by `close_ranks`)."""
    threads_before = torch.get_num_threads()
    if device.type == "cpu" and not tensor_parallel:
        threads = fit_to_usable_cores()  # ranks split the cores themselves (start_ranks)
        log.info(
            "CPU matrix instructions: %s; %d compute threads; grid weights: %s",
            describe_cpu()["cpu_matrix_isa"],
            threads,
            describe_matrix_path()["cpu_prefill_path"],
        )
    return threads_before


def start_other_ranks(
    config: EngineConfig, model_dir: Path, device: torch.device, threads_before: int
) -> list[WorkerProcess]:
    if config.node_rank != 0:
        raise EngineError(
            f"node_rank {config.node_rank} runs workers only (engine.distributed."
            "launch.run_node, or `resident serve --node-rank`); the engine is node 0"
        )
    try:
        return start_ranks(config, model_dir, device)
    except BaseException:
        torch.set_num_threads(threads_before)
        raise


def abandon_other_ranks(
    workers: list[WorkerProcess], error: BaseException, threads_before: int
) -> BaseException:
    """Stop the ranks after rank 0's load failed; the error to raise (theirs may say more)."""
    torch.set_num_threads(threads_before)
    return abandon_ranks(workers, error)


def close_ranks(
    executor: LocalExecutor | MultiProcessExecutor, tensor_parallel: bool, threads_before: int
) -> None:
    """Stop the worker ranks, if any, and give this thread its compute threads back."""
    if tensor_parallel:
        executor.close()
        torch.set_num_threads(threads_before)
