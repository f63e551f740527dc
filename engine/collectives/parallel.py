"""Which shard this process is, and the collectives the model layers run.

One process per rank (one per GPU; on CPU, processes splitting the cores).
Every rank builds the same model classes; the layers read the tensor-parallel
rank and size here when they are constructed and take their slice of every
split dimension. At size 1 (the default, nothing initialised) every
collective is a no-op, so a single-process engine runs the same code.

Two groups: the tensor group carries activations (NCCL on GPUs, gloo on
CPU), and a gloo group carries the control plane (each step's batch, sent
as a Python object from rank 0), which NCCL cannot do.
"""

from __future__ import annotations

import datetime
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelLayout:
    """How the model is split: tensor-parallel size and rank, and how MoE experts go.

    expert_parallel: routed experts are dealt whole to ranks (expert e lives
    on rank e % size) instead of each expert's intermediate dimension being
    split over all ranks; shared experts and dense MLPs are split either way.
    """

    size: int = 1
    rank: int = 0
    expert_parallel: bool = False

    def describe(self) -> dict:
        return {"tp": self.size, "ep": self.size if self.expert_parallel else 1}


_layout = ParallelLayout()
_control_group = None


def layout() -> ParallelLayout:
    return _layout


def tp_size() -> int:
    return _layout.size


def tp_rank() -> int:
    return _layout.rank


def set_layout(new: ParallelLayout) -> None:
    """Set the layout the next model built in this process takes (tests, workers)."""
    global _layout
    _layout = new


@contextmanager
def unsplit():
    """Build layers whole inside this block (an expert-parallel rank's own experts)."""
    global _layout
    saved = _layout
    _layout = ParallelLayout(1, 0, saved.expert_parallel)
    try:
        yield
    finally:
        _layout = saved


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str = "127.0.0.1",
    master_port: int = 29500,
    device: torch.device | None = None,
    expert_parallel: bool = False,
    timeout_s: float = 600.0,
) -> None:
    """Join the process group over TCP rendezvous (the same across nodes) and set the layout.

    NCCL for tensors when the device is a GPU, else gloo; the control group is
    always gloo, on CPU tensors."""
    global _control_group
    device = device or torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    options = {}
    if backend == "nccl":
        # Bind NCCL to this rank's GPU up front (no guessing from the current device).
        index = device.index if device.index is not None else torch.cuda.current_device()
        options["device_id"] = torch.device("cuda", index)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        **options,
    )
    _control_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    set_layout(ParallelLayout(world_size, rank, expert_parallel))
    log.info("rank %d of %d joined (%s, pid %d)", rank, world_size, backend, os.getpid())


def destroy_distributed() -> None:
    global _control_group
    if dist.is_initialized():
        dist.destroy_process_group()
    _control_group = None
    set_layout(ParallelLayout())


def control_group():
    """The gloo group for Python objects (None: the default group, when it is gloo)."""
    return _control_group


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over the tensor-parallel ranks, in place; returns x."""
    if _layout.size > 1:
        dist.all_reduce(x)
    return x


def all_reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum over the ranks, in place (KV scale calibration)."""
    if _layout.size > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's x along the last dimension (the vocabulary shards)."""
    if _layout.size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(_layout.size)]
    dist.all_gather(parts, x)
    return torch.cat(parts, dim=-1)


def split_size(total: int, what: str) -> int:
    """This rank's share of a dimension that splits evenly, or a clear error."""
    size = _layout.size
    if total % size:
        raise ValueError(f"{what} ({total}) does not split over {size} tensor-parallel ranks")
    return total // size


def rank_heads(num_heads: int, what: str, replicas: bool = False) -> tuple[int, int]:
    """(first head, head count) of the `num_heads` this rank holds. `replicas`: with
    fewer heads than ranks each head is replicated on tp/num_heads ranks (GQA
    key/value heads; never query heads, whose outputs the ranks sum)."""
    tp, rank = tp_size(), tp_rank()
    if num_heads >= tp or not replicas:
        local = split_size(num_heads, what)
        return rank * local, local
    if tp % num_heads:
        raise ValueError(f"{what} ({num_heads}) cannot be replicated evenly over {tp} ranks")
    return rank // (tp // num_heads), 1
