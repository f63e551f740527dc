"""Suite-wide set-up that must happen before any test module is imported, and the
check that no test leaves a tensor-parallel rank behind.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when the
kernel modules are first imported, which any test module may do; on a
machine without a GPU the kernels can only run in the interpreter.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The prefix KV disk tier (agent sessions, `resident serve`) writes under the user
# cache; tests, and the servers and CLIs they start, write to a folder of their own.
os.environ.setdefault("RESIDENT_CACHE_DIR", tempfile.mkdtemp(prefix="resident-test-cache-"))


@pytest.fixture(autouse=True)
def no_rank_left_behind():
    """Every test ends as it began: this process holds no rank of a tensor-parallel
    group and no worker rank it started still runs. A test that fails half-way (or a
    fixture that forgot) must not make every later test fail with "this process
    already holds rank 0": whatever it left is closed here, and the test errors
    saying so. A fixture may not keep ranks across tests: each test starts its own."""
    yield
    left = _ranks_left()
    if left:
        _close_ranks_left()
        pytest.fail(f"the test left {left} behind (now closed): close engines in teardown")


def _rank_workers() -> list:
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return []
    # engine.distributed.launch names each worker process after its rank.
    return [p for p in multiprocessing.active_children() if p.name.startswith("resident-rank-")]


def _ranks_left() -> str:
    """What of a tensor-parallel engine is still open; cheap, and imports nothing (no
    rank can be held before engine.distributed is imported)."""
    parallel = sys.modules.get("engine.collectives.parallel")
    left = []
    if parallel is not None:
        layout = parallel.layout()
        if layout.size > 1 or torch.distributed.is_initialized():
            left.append(f"rank {layout.rank} of a {layout.size}-rank group")
    workers = _rank_workers()
    if workers:
        left.append("worker ranks (pids " + ", ".join(str(p.pid) for p in workers) + ")")
    return " and ".join(left)


def _close_ranks_left() -> None:
    """Close what a test left: its tensor-parallel engines the way LLM.close() does
    (shutdown message, workers stopped by PID, group destroyed), then whatever still
    stands. Single-process engines (a session's server) are left alone."""
    import gc

    from engine.async_engine import AsyncEngine
    from engine.collectives import parallel
    from engine.distributed.executor import MultiProcessExecutor

    for found in gc.get_objects():
        if isinstance(found, AsyncEngine) and found.engine.tensor_parallel:
            if not found._stopped.is_set():
                found.shutdown()
    for found in gc.get_objects():
        if isinstance(found, MultiProcessExecutor):
            found.close()  # a no-op when already closed
    for worker in _rank_workers():
        worker.kill()
        worker.join(10)
    try:
        parallel.destroy_distributed()
    except Exception:  # a group broken already
        parallel.set_layout(parallel.ParallelLayout())
