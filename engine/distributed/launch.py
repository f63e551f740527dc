"""Starting and stopping the worker processes of a node, and joining the process group.

Ranks are numbered node by node: node r runs ranks r*L .. r*L+L-1, L being
tensor_parallel_size / nnodes. Node 0's first rank is the engine process
itself (scheduler, prefix cache, server); every other rank is a worker
process started here with the spawn start method. A node other than 0 starts
only its workers and waits for them (`run_node`).

Workers are stopped by PID: terminate, then kill after a timeout. Each also
watches its parent (engine.distributed.worker), so none outlives the
process that started it.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path

import torch
import torch.distributed as dist

from engine.collectives import parallel
from engine.config import EngineConfig
from engine.distributed.worker import COLLECTIVE_TIMEOUT_S, WorkerSpec, worker_main
from engine.errors import EngineError, WorkerDiedError
from engine.host.threads import usable_cores
from engine.model_files.store import resolve_model

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0


class WorkerProcess:
    """A started worker: its rank, process and the pipe it reports a start-up error on."""

    def __init__(self, rank: int, process: mp.process.BaseProcess, errors: Connection):
        self.rank = rank
        self.process = process
        self.errors = errors
        self._error: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def error(self) -> str | None:
        """The error the worker reported before it exited, if any."""
        try:
            while self._error is None and self.errors.poll():
                self._error = self.errors.recv()
        except (EOFError, OSError):
            pass
        return self._error

    def describe_exit(self) -> str:
        code = self.process.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        error = self.error()
        return f"rank {self.rank} (pid {self.pid}) {how}" + (f": {error}" if error else "")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def cpu_threads(local_ranks: int) -> int:
    """torch threads per rank on CPU: the node's cores split between its ranks."""
    return max(1, usable_cores() // local_ranks)


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """One GPU per local rank (CUDA_VISIBLE_DEVICES chooses which); CPU ranks share the CPU."""
    return torch.device("cuda", local_rank) if device.type == "cuda" else torch.device("cpu")


def start_workers(
    config: EngineConfig,
    model_dir: Path,
    device: torch.device,
    master_addr: str,
    master_port: int,
) -> list[WorkerProcess]:
    """Start this node's worker ranks (on node 0 all but the first, which is the caller)."""
    context = mp.get_context("spawn")
    local = config.local_ranks
    first = config.node_rank * local
    die_with_parent = threading.current_thread() is threading.main_thread()
    workers: list[WorkerProcess] = []
    try:
        for local_rank in range(1 if config.node_rank == 0 else 0, local):
            spec = WorkerSpec(
                config=config,
                model_dir=str(model_dir),
                rank=first + local_rank,
                world_size=config.tensor_parallel_size,
                local_rank=local_rank,
                master_addr=master_addr,
                master_port=master_port,
                device=str(rank_device(device, local_rank)),
                threads=cpu_threads(local),
                parent_pid=os.getpid(),
                die_with_parent=die_with_parent,
            )
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=worker_main,
                args=(spec, send),
                name=f"resident-rank-{spec.rank}",
                daemon=True,
            )
            process.start()
            send.close()  # the child holds its end
            workers.append(WorkerProcess(spec.rank, process, receive))
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[WorkerProcess], grace: float = 0.0) -> None:
    """Wait up to `grace` seconds for workers already told to stop, then terminate the
    rest, then kill what still runs after STOP_TIMEOUT_S: by PID, never by name."""
    deadline = time.monotonic() + grace
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.is_alive():
            if grace:
                log.warning(
                    "rank %d (pid %d) did not stop; terminating it", worker.rank, worker.pid
                )
            worker.process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for worker in workers:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            log.warning("rank %d (pid %d) ignored SIGTERM; killing it", worker.rank, worker.pid)
            worker.process.kill()
            worker.process.join(STOP_TIMEOUT_S)
    for worker in workers:
        worker.errors.close()


def join_group(
    config: EngineConfig,
    device: torch.device,
    master_addr: str,
    master_port: int,
    workers: list[WorkerProcess],
) -> None:
    """Rank 0 joins the process group, watching its workers meanwhile: one that dies
    before the group forms is an error at once, not after the collective timeout."""
    failure: list[BaseException] = []
    joined = threading.Event()

    def join() -> None:
        try:
            parallel.init_distributed(
                0,
                config.tensor_parallel_size,
                master_addr,
                master_port,
                device,
                config.expert_parallel,
                COLLECTIVE_TIMEOUT_S,
            )
        except BaseException as err:  # handed to the waiting thread
            failure.append(err)
        finally:
            joined.set()

    threading.Thread(target=join, name="resident-rendezvous", daemon=True).start()
    while not joined.is_set():
        wait([w.sentinel for w in workers], timeout=0.2)
        dead = [w for w in workers if not w.is_alive()]
        if dead:
            raise WorkerDiedError(
                f"{dead[0].describe_exit()} before the ranks met (see its log above). Workers "
                "are started with multiprocessing's spawn, which imports the main script "
                'again: a script must start the engine under `if __name__ == "__main__":`',
                advice=None,
            )
    if failure:
        raise failure[0]


def check_no_rank_here(tensor_parallel: bool) -> None:
    """One process holds one rank: the layout the model layers read, and the
    collectives their forward runs, belong to the process (engine.collectives.parallel)."""

    layout = parallel.layout()
    if layout.size > 1 or (tensor_parallel and dist.is_initialized()):
        raise EngineError(
            f"this process already holds rank {layout.rank} of a tensor-parallel group "
            f"({layout.size} ranks), and one process holds one rank: close that engine "
            "(LLM.close()) before starting another here"
        )


def start_ranks(config: EngineConfig, model_dir: Path, device: torch.device) -> list[WorkerProcess]:
    """Rank 0: split the CPU between the node's ranks, start the workers and join them."""
    port = config.master_port or free_port(config.master_addr)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(config.local_ranks))
    log.info(
        "tensor parallel: %d ranks on %d node(s), rank 0 at %s:%d (pid %d)",
        config.tensor_parallel_size,
        config.nnodes,
        config.master_addr,
        port,
        os.getpid(),
    )
    workers = start_workers(config, model_dir, device, config.master_addr, port)
    try:
        join_group(config, device, config.master_addr, port, workers)
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def abandon_ranks(workers: list[WorkerProcess], error: BaseException) -> BaseException:
    """Rank 0 could not build its part: close the group (a worker waiting in a collective
    then fails too), stop the workers, and return the error to raise: the rank that
    died when a collective failed because a worker was gone, else `error` itself."""
    explained: BaseException = error
    if isinstance(error, RuntimeError) and not isinstance(error, EngineError):
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and all(w.is_alive() for w in workers):
            time.sleep(0.05)
        dead = [w for w in workers if not w.is_alive()]
        if dead:
            explained = WorkerDiedError(
                f"while the ranks started, {dead[0].describe_exit()}", advice=None
            )
    try:
        parallel.destroy_distributed()
    except Exception:  # the group is broken already
        pass
    stop_workers(workers, grace=STOP_TIMEOUT_S)
    return explained


class _Stopped(Exception):
    """SIGTERM reached a node process."""


def run_node(config: EngineConfig) -> int:
    """A node other than 0: start its ranks and wait; exit when they do (0 when all
    stopped cleanly). SIGTERM (0) or SIGINT (130) stop the workers first."""
    if config.node_rank == 0:
        raise ValueError("node 0 runs the engine; run_node is for the other nodes")
    model_dir = resolve_model(config.model)
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    workers = start_workers(config, model_dir, device, config.master_addr, config.master_port)
    first, last = workers[0].rank, workers[-1].rank
    log.info(
        "node %d of %d: ranks %d..%d started (pids %s); rank 0 at %s:%d",
        config.node_rank,
        config.nnodes,
        first,
        last,
        ", ".join(str(w.pid) for w in workers),
        config.master_addr,
        config.master_port,
    )

    def stop(signum, _frame) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        waiting = list(workers)
        failed = False
        while waiting:
            wait([w.sentinel for w in waiting])
            for worker in [w for w in waiting if not w.is_alive()]:
                waiting.remove(worker)
                if worker.process.exitcode != 0:
                    log.error("%s", worker.describe_exit())
                    failed = True
            if failed:
                break
        return 1 if failed else 0
    except _Stopped:  # SIGTERM: stop the workers, a clean exit
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        stop_workers(workers)
        signal.signal(signal.SIGTERM, previous)
