"""A tensor-parallel worker killed with SIGKILL: pending and new requests fail with a
clear error within seconds, /health says which rank died, nothing hangs."""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import pytest

from engine import SamplingParams
from engine.errors import WorkerDiedError
from tests.engine.distributed.helpers import is_running, kill_all, wait_until

SETTINGS = dict(
    dtype="float32", kv_cache_dtype="auto", attention_backend="torch", kv_memory_gib=0.01
)


def test_a_killed_worker_fails_pending_and_new_requests_and_health(tiny_llama_dir):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.server.app import create_app
    from engine.server.served_model import ServedModel

    config = EngineConfig(model=str(tiny_llama_dir), tensor_parallel_size=2, **SETTINGS)
    engine = AsyncEngine(config)
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

    try:
        # A hang is a failure, not a stuck test run.
        asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    finally:
        engine.shutdown()
        kill_all([worker.pid])
    wait_until(lambda: not is_running(worker.pid), 10, "the killed worker to be reaped")
