"""A tensor-parallel worker killed with SIGKILL: pending and new requests fail with a
clear error within seconds, /health says which rank died, nothing hangs; and closing an
engine releases its rank however its ranks ended."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import httpx
import pytest
import torch.distributed as dist

from engine import SamplingParams
from engine.collectives import parallel
from engine.distributed import executor as executor_module
from engine.errors import WorkerDiedError
from tests.engine.distributed.helpers import is_running, kill_all, patience, wait_until

SETTINGS = dict(
    dtype="float32", kv_cache_dtype="auto", attention_backend="torch", kv_memory_gib=0.01
)


@pytest.fixture
def tp2_engine(tiny_llama_dir):
    """An AsyncEngine over 2 ranks, shut down (workers stopped, group closed) whatever
    the test did, and its worker killed by PID if it outlived that."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    config = EngineConfig(model=str(tiny_llama_dir), tensor_parallel_size=2, **SETTINGS)
    engine = AsyncEngine(config)
    pids = [w.pid for w in engine.engine.executor.workers]
    try:
        yield engine
    finally:
        engine.shutdown()
        kill_all(pids)


def _holds_no_rank() -> bool:
    return parallel.layout().size == 1 and not dist.is_initialized()


def test_a_killed_worker_fails_pending_and_new_requests_and_health(tp2_engine):
    from engine.server.app import create_app
    from engine.server.served_model import ServedModel

    engine = tp2_engine
    (worker,) = engine.engine.executor.workers
    app = create_app(engine, ServedModel.from_engine(engine, "tiny"))
    long = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tp") as client:
            assert (await client.get("/health")).status_code == 200
            pending = engine.generate([1, 2, 3], long, "pending")
            first = await anext(pending)
            assert not first.finished
            os.kill(worker.pid, signal.SIGKILL)
            with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid \d+\) was killed by SIGKILL"):
                async for _ in pending:
                    pass
            health = await client.get("/health")
            assert health.status_code == 503
            assert "rank 1" in health.json()["error"]["message"]
            with pytest.raises(WorkerDiedError, match="rank 1"):
                async for _ in engine.generate([4, 5], long, "new"):
                    pass
            stats = (await client.get("/v1/engine/stats")).json()
            assert stats["parallel"]["ranks_alive"] == 1

    # A hang is a failure, not a stuck test run; about 2 s on an idle machine.
    asyncio.run(asyncio.wait_for(scenario(), timeout=patience(6)))
    engine.shutdown()
    assert _holds_no_rank()  # a failed engine, closed, holds no rank
    wait_until(lambda: not is_running(worker.pid), patience(1), "the killed worker to be reaped")


def test_close_releases_the_rank_while_a_step_still_runs(tiny_llama_dir, monkeypatch):
    """close() while another thread is inside a step (here: holds the step lock until
    the workers are gone, as a step waiting on a collective would) still stops the
    workers and closes the group, so the process can start another engine."""
    from engine import LLM

    monkeypatch.setattr(executor_module, "STOP_TIMEOUT_S", 2.0)  # how long close() waits
    with LLM(str(tiny_llama_dir), tensor_parallel_size=2, **SETTINGS) as llm:
        executor = llm.engine.executor
        (worker,) = executor.workers
        busy, step_over = threading.Event(), threading.Event()

        def step() -> None:
            with executor._step_lock:
                busy.set()
                # The step's collective ends when its peer is gone.
                wait_until(lambda: not worker.is_alive(), patience(2), "the worker", poll=0.01)
                step_over.set()

        threading.Thread(target=step, daemon=True).start()
        assert busy.wait(patience(1))
        llm.close()
        assert step_over.is_set() and not worker.is_alive()
        assert _holds_no_rank()
    with LLM(str(tiny_llama_dir), **SETTINGS) as again:  # the process may start another
        assert again.generate([[1, 2, 3]])[0].outputs[0].token_ids
