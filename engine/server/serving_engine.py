"""The engine as the HTTP layer sees it: what a route may call, and nothing more.

`resident serve` serves an AsyncEngine (engine/async_engine.py); the e2e tests
serve a scripted double (tests/e2e/scripted_engine.py), which has the first two.
No route aborts a request itself: closing `generate`'s iterator does (a client
that went away, engine/server/generation.py). The worker endpoints routers call
(engine/server/worker_routes.py) use `load`, `flush_cache` and `kv_event_sources`. Two more are read
when present (app.py): `is_alive()`, false once the engine thread has stopped,
and `failure()`, why the engine cannot serve.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from engine.requests.outputs import RequestOutput
from engine.requests.params import SamplingParams


class ServingEngine(Protocol):
    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str = "",
    ) -> AsyncIterator[RequestOutput]:
        """Outputs for one request as it progresses; the last has `finished` set.
        Refusals (a prompt too long, a full queue) are raised before the first;
        leaving the loop early aborts the request."""
        ...

    async def stats(self) -> dict:
        """The `/v1/engine/stats` object (and what `/metrics` reads of the KV cache)."""
        ...

    async def load(self) -> dict:
        """Requests `running` and `waiting`, `waiting_tokens` still to compute, and KV
        `used_tokens`, `cached_tokens`, `capacity_tokens` (cheap: routers poll it)."""
        ...

    async def kv_event_sources(self) -> dict:
        """vllm-router's /kv_event_sources: the KV-event publisher per data-parallel
        rank, `{}` when the engine publishes none."""
        ...

    async def flush_cache(self) -> dict[str, int]:
        """Forget every cached prefix; counts of what was dropped (`tokens`,
        `pinned_tokens`, `host_pages`, `host_bytes`, `disk_pages`, `disk_bytes`) and
        kept (`in_use_tokens`: pages running requests hold)."""
        ...
