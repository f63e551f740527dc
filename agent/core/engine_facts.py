"""What an interactive front end shows about the engine: where it runs, its KV cache, its settings.

Attached, the server's `/v1/engine/stats` (DESIGN.md §2) says it; servers
that do not publish it (vLLM, SGLang) leave the KV dtype unknown. Local, the
in-process engine is asked directly. `reachable` is the probe a front end
uses to tell when a lost server is back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from agent.core.clients import HTTPClient, LLMClient
from agent.core.clients.http import api_root

PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class EngineFacts:
    model: str
    engine: str  # "local", or the server's URL
    kv_cache_dtype: str | None = None  # None: the server does not say
    capacity_tokens: int | None = None
    cache_hit_rate: float | None = None
    # The engine settings in force (a Resident engine's EngineConfig); None: not published.
    settings: dict[str, Any] | None = None


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _remote_stats(url: str, api_key: str | None) -> dict[str, Any] | None:
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=_headers(api_key)) as http:
            response = await http.get(api_root(url) + "/v1/engine/stats")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        stats = response.json()
    except ValueError:
        return None
    return stats if isinstance(stats, dict) else None


async def _local_stats(client: LLMClient) -> dict[str, Any] | None:
    engine = getattr(client, "engine", None)
    if engine is None:
        return None
    stats = await engine.stats()
    if not isinstance(stats, dict):
        return None
    # What a server's /v1/engine/stats adds: the settings the engine runs with.
    settings = getattr(client, "engine_settings", None)
    return {**stats, "settings": settings()} if callable(settings) else stats


def _number(value: Any, kind: type) -> Any:
    try:
        return kind(value) if value is not None else None
    except (TypeError, ValueError):
        return None


async def engine_facts(client: LLMClient, api_key: str | None = None) -> EngineFacts:
    if isinstance(client, HTTPClient):
        where = client.url
        stats = await _remote_stats(client.url, api_key)
    else:
        where = "local"
        stats = await _local_stats(client)
    stats = stats or {}
    dtype = stats.get("kv_cache_dtype")
    return EngineFacts(
        model=client.model,
        engine=where,
        kv_cache_dtype=str(dtype) if dtype else None,
        capacity_tokens=_number(stats.get("capacity_tokens"), int),
        cache_hit_rate=_number(stats.get("cache_hit_rate"), float),
        settings=settings if isinstance(settings := stats.get("settings"), dict) else None,
    )


async def reachable(url: str, api_key: str | None = None) -> bool:
    """Whether the server answers HTTP at all (any status: it is up)."""
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=_headers(api_key)) as http:
            await http.get(api_root(url) + "/v1/models")
    except httpx.HTTPError:
        return False
    return True
