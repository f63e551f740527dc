"""Run a function on N tensor-parallel ranks (gloo, CPU) and get rank 0's result.

For tests and benchmarks of the split layers: each rank is a spawned process
that joins the process group on a free loopback port, sets the layout, runs
`fn(rank, *args)` and, on rank 0, hands back what it returns (through a
file, so large tensors need no pipe). Every rank must make the same
collective calls in the same order: give them the same work.
"""

from __future__ import annotations

import importlib
import os
import pickle
import socket
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine.collectives import parallel


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, target: str, args: tuple, out: str) -> None:
    # Ranks share the machine's cores; more threads than cores only thrash.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    parallel.init_distributed(rank, world, "127.0.0.1", port, timeout_s=120)
    try:
        module, name = target.rsplit(":", 1)
        result = getattr(importlib.import_module(module), name)(rank, *args)
        if rank == 0:
            Path(out).write_bytes(pickle.dumps(result))
    finally:
        parallel.destroy_distributed()


def run_on_ranks(world: int, target: str, *args):
    """`target` is "module:function"; called as function(rank, *args) on every rank."""
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "rank0.pkl")
        mp.start_processes(
            _rank_main,
            args=(world, free_port(), target, args, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        return pickle.loads(Path(out).read_bytes())
