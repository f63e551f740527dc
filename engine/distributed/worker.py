"""A worker rank: join the group, build this rank's model, run every step rank 0 sends.

The process is started by engine.distributed.launch (spawn). It builds its
model shard, KV pool and runner with the same function rank 0 uses
(engine.execution.rank_model), then loops: receive rank 0's message over the control
group, rebuild the batch, run the same forward (its collectives meet rank
0's), until a shutdown message. Only rank 0 samples.

It never outlives rank 0: PR_SET_PDEATHSIG kills it when its parent dies
(Linux, when started from the parent's main thread), a watchdog thread exits
when the parent's pid is gone or rank 0 has been silent far longer than its
pings allow (a node that vanished without closing its sockets), and a failed
collective (a peer's sockets closed) ends the loop with an error.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import torch
import torch.distributed as dist

from engine.collectives import parallel
from engine.config import EngineConfig
from engine.distributed.step import PING_INTERVAL_S, SHUTDOWN, STEP, rebuild_batch, run_step
from engine.errors import EngineError

log = logging.getLogger(__name__)

# The collective timeout: how long a rank waits for the others in one collective,
# which includes waiting for the slowest rank to load its weights at start-up. An
# idle group stays inside it with pings (engine.distributed.executor).
COLLECTIVE_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs to become its rank (pickled to it)."""

    config: EngineConfig
    model_dir: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    device: str
    threads: int  # torch threads on CPU
    parent_pid: int
    die_with_parent: bool  # PR_SET_PDEATHSIG: only when started from the main thread


# Rank 0 pings an idle group every PING_INTERVAL_S; silence ten times as long means
# it is gone without its sockets closing (a node that lost power or network).
SILENCE_LIMIT_S = 10 * PING_INTERVAL_S
_PR_SET_PDEATHSIG = 1


class Watchdog(threading.Thread):
    """Exits the process when its parent is gone or rank 0 falls silent."""

    def __init__(self, rank: int, parent_pid: int):
        super().__init__(name="resident-watchdog", daemon=True)
        self.rank = rank
        self.parent_pid = parent_pid
        self.waiting_since: float | None = None  # set while waiting for rank 0's message

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != self.parent_pid:
                log.error("rank %d: the process that started it has gone; exiting", self.rank)
                os._exit(1)
            since = self.waiting_since
            if since is not None and time.monotonic() - since > SILENCE_LIMIT_S:
                log.error(
                    "rank %d: rank 0 has sent nothing for %.0f s; exiting",
                    self.rank,
                    SILENCE_LIMIT_S,
                )
                os._exit(1)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (thread) exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError) as err:  # the watchdog still covers it
        log.warning("PR_SET_PDEATHSIG unavailable (%s); relying on the watchdog", err)


def serve_steps(runner, deterministic: bool, watchdog: Watchdog | None = None) -> None:
    """Run every step rank 0 broadcasts until it says to shut down."""
    box: list = [None]
    group = parallel.control_group()
    while True:
        if watchdog is not None:
            watchdog.waiting_since = time.monotonic()
        dist.broadcast_object_list(box, src=0, group=group)
        if watchdog is not None:
            watchdog.waiting_since = None
        message = box[0]
        if message.kind == SHUTDOWN:
            return
        if message.kind == STEP:
            run_step(runner, rebuild_batch(message), set(message.want), deterministic)


def worker_main(spec: WorkerSpec, errors: Connection) -> None:
    """The worker process's entry point (multiprocessing target)."""
    logging.basicConfig(
        level=logging.WARNING, format=f"rank {spec.rank} %(levelname)s %(name)s: %(message)s"
    )
    # Ctrl-C reaches the whole process group; rank 0 (or the node process) stops workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.die_with_parent:
        _die_with_parent()
    if os.getppid() != spec.parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    watchdog = Watchdog(spec.rank, spec.parent_pid)
    watchdog.start()
    device = torch.device(spec.device)
    if device.type == "cpu":
        torch.set_num_threads(spec.threads)
    else:
        torch.cuda.set_device(device)
    code = 0
    try:
        parallel.init_distributed(
            spec.rank,
            spec.world_size,
            spec.master_addr,
            spec.master_port,
            device,
            spec.config.expert_parallel,
            COLLECTIVE_TIMEOUT_S,
        )
        from engine.execution.rank_model import build_rank_model

        runner = build_rank_model(spec.config, Path(spec.model_dir), device).runner
        serve_steps(runner, spec.config.deterministic, watchdog)
    except BaseException as err:
        code = 1
        message = f"{type(err).__name__}: {err}"
        expected = isinstance(err, (EngineError, RuntimeError))  # bad input, a peer gone
        log.error("rank %d stopped: %s", spec.rank, message, exc_info=not expected)
        try:
            errors.send(message)
        except OSError:
            pass
    finally:
        try:
            parallel.destroy_distributed()
        except Exception:  # the group is already broken; the process is ending
            pass
        errors.close()
    sys.exit(code)
