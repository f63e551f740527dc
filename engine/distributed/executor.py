"""How LLMEngine runs a scheduled step: in this process, or on every tensor-parallel rank.

`LocalExecutor` is the single-process engine: the runner, called directly,
nothing added. `MultiProcessExecutor` is rank 0 of a tensor-parallel group:
each step it broadcasts the batch (engine.distributed.step) over the control
group, then runs its own runner; the workers run the same step. It also
watches the ranks:

- a monitor thread waits on the local workers' process sentinels; a worker
  that exits while the engine is not closing marks the engine failed, naming
  the rank;
- a failed collective (a peer's sockets closed) or any error inside a step
  marks it failed too (the ranks are then out of step);
- an idle group is pinged, so no rank waits in a collective past its timeout.

Failure is final: callbacks run (the async engine fails every pending request
at once, even if the engine thread is stuck), the surviving local workers are
stopped, the process group is torn down (so other nodes' workers see their
sockets close and exit), and every later step or request raises
WorkerDiedError. `close()` sends the workers a shutdown message and stops them
by PID; it also runs at exit.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait

import torch.distributed as dist

from engine.collectives import parallel
from engine.config import EngineConfig
from engine.distributed.launch import STOP_TIMEOUT_S, WorkerProcess, stop_workers
from engine.distributed.step import (
    PING,
    PING_INTERVAL_S,
    SHUTDOWN,
    StepMessage,
    describe_step,
    run_step,
)
from engine.errors import WorkerDiedError

log = logging.getLogger(__name__)

# After a failed collective, how long to wait for a local worker's exit to show,
# so the error names the rank that died rather than the symptom.
EXPLAIN_WAIT_S = 2.0


class LocalExecutor:
    """One process, one rank: today's direct call of the runner."""

    failure: str | None = None

    def __init__(self, runner, deterministic: bool):
        self.runner = runner
        self.deterministic = deterministic

    def run(self, batch, want: set[int]):
        return run_step(self.runner, batch, want, self.deterministic)

    def on_failure(self, callback: Callable[[str], None]) -> None:
        pass  # one process cannot lose a rank

    def describe(self) -> dict:
        return {"tp": 1, "ep": 1, "nnodes": 1, "ranks_alive": 1}

    def close(self) -> None:
        pass


class MultiProcessExecutor:
    """Rank 0 of a tensor-parallel group (see the module docstring)."""

    def __init__(self, runner, config: EngineConfig, workers: list[WorkerProcess], page_size: int):
        self.runner = runner
        self.config = config
        self.workers = workers
        self.page_size = page_size
        self.deterministic = config.deterministic
        self.world_size = config.tensor_parallel_size
        self.failure: str | None = None
        self._callbacks: list[Callable[[str], None]] = []
        self._step_lock = threading.Lock()  # one collective sequence at a time
        self._state_lock = threading.Lock()
        self._closing = threading.Event()
        self._closed = False
        self._last_sent = time.monotonic()
        self._watcher = threading.Thread(target=self._watch, name="resident-ranks", daemon=True)
        self._watcher.start()
        self._atexit = _close_at_exit(self)
        atexit.register(self._atexit)

    # ----- the step -------------------------------------------------------------
    def run(self, batch, want: set[int]):
        with self._step_lock:
            if self.failure is not None:
                raise WorkerDiedError(self.failure)
            message = describe_step(batch, want, self.page_size)
            try:
                self._broadcast(message)
                return run_step(self.runner, batch, want, self.deterministic)
            except Exception as err:
                self._fail(self._explain(err))
                raise WorkerDiedError(self.failure or "the engine is shutting down") from err

    def _broadcast(self, message: StepMessage) -> None:
        dist.broadcast_object_list([message], src=0, group=parallel.control_group())
        self._last_sent = time.monotonic()

    # ----- watching the ranks -------------------------------------------------------
    def _watch(self) -> None:
        while not self._closing.is_set() and self.failure is None:
            alive = [w for w in self.workers if w.is_alive()]
            if alive:
                wait([w.sentinel for w in alive], timeout=0.5)
            else:
                self._closing.wait(0.5)
            if self._closing.is_set():
                return
            dead = [w for w in self.workers if not w.is_alive()]
            if dead:
                self._fail(dead[0].describe_exit())
                return
            if time.monotonic() - self._last_sent >= PING_INTERVAL_S:
                self._ping()

    def _ping(self) -> None:
        if not self._step_lock.acquire(blocking=False):
            return  # a step is running: the group is not idle
        try:
            if self.failure is None and not self._closing.is_set():
                self._broadcast(StepMessage(PING))
        except Exception as err:
            self._fail(self._explain(err))
        finally:
            self._step_lock.release()

    def _explain(self, err: BaseException) -> str:
        """Name the rank that died when a local one did; else describe the error."""
        deadline = time.monotonic() + EXPLAIN_WAIT_S
        while True:
            dead = [w for w in self.workers if not w.is_alive()]
            if dead:
                return dead[0].describe_exit()
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return (
            f"a step failed on rank 0 ({type(err).__name__}: {err}); the ranks can no "
            "longer run in step"
        )

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (from any thread) when the engine fails."""
        self._callbacks.append(callback)
        if self.failure is not None:
            callback(self.failure)

    def _fail(self, message: str) -> None:
        with self._state_lock:
            if self.failure is not None or self._closing.is_set():
                return
            self.failure = message
        log.error(
            "tensor-parallel engine failed: %s. Every request now fails; restart the engine.",
            message,
        )
        for callback in list(self._callbacks):
            try:
                callback(message)
            except Exception:
                log.exception("a failure callback raised")
        threading.Thread(target=self._tear_down, name="resident-stop-ranks", daemon=True).start()

    def _tear_down(self) -> None:
        """After a failure: stop the surviving workers, then close the group so the
        ranks on other nodes see their sockets close and exit."""
        stop_workers(self.workers)
        if self._step_lock.acquire(timeout=30):
            try:
                parallel.destroy_distributed()
            except Exception as err:
                log.warning("closing the process group after the failure: %s", err)
            finally:
                self._step_lock.release()
        else:
            log.warning("a step is stuck on rank 0; the process group was left open")

    def describe(self) -> dict:
        """The layout and the ranks alive (local workers seen alive; other nodes' ranks
        count while the group stands, i.e. until a failure)."""
        local = sum(w.is_alive() for w in self.workers)
        remote = self.world_size - self.config.local_ranks
        alive = 1 + local + (remote if self.failure is None else 0)
        ep = self.world_size if self.config.expert_parallel else 1
        return {"tp": self.world_size, "ep": ep, "nnodes": self.config.nnodes, "ranks_alive": alive}

    # ----- shutdown --------------------------------------------------------------
    def close(self) -> None:
        """Tell the workers to stop, stop them by PID if they do not, close the group."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
        atexit.unregister(self._atexit)
        locked = self._step_lock.acquire(timeout=STOP_TIMEOUT_S)
        try:
            told = False
            if locked and self.failure is None:
                try:
                    self._broadcast(StepMessage(SHUTDOWN))
                    told = True
                except Exception as err:
                    log.warning("could not tell the workers to stop (%s); stopping them", err)
            stop_workers(self.workers, grace=STOP_TIMEOUT_S if told else 0.0)
            if not locked:
                # A step was still running (a slow machine, or another thread mid-request).
                # Its collectives fail now that the local workers are gone, and it lets go;
                # the group must still close, or this process holds rank 0 for good.
                locked = self._step_lock.acquire(timeout=STOP_TIMEOUT_S)
                if not locked:
                    log.warning("a step is stuck on rank 0; the process group was left open")
            if locked:
                parallel.destroy_distributed()
        finally:
            if locked:
                self._step_lock.release()
        self._watcher.join(timeout=5)


def _close_at_exit(executor: MultiProcessExecutor) -> Callable[[], None]:
    """An atexit hook that does not keep the executor alive."""
    ref = weakref.ref(executor)

    def close() -> None:
        live = ref()
        if live is not None:
            live.close()

    return close


def make_executor(runner, config: EngineConfig, workers: list[WorkerProcess] | None):
    if config.tensor_parallel_size == 1:
        return LocalExecutor(runner, config.deterministic)
    return MultiProcessExecutor(runner, config, workers or [], config.page_size)
