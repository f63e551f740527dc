"""The agent's local engine speculates with prompt lookup unless told otherwise."""

from __future__ import annotations

import engine.async_engine
from agent.core.clients.local import start_engine


def test_local_engine_uses_prompt_lookup_by_default(monkeypatch):
    configs = []
    monkeypatch.setattr(engine.async_engine, "AsyncEngine", configs.append)
    start_engine("some-model")
    start_engine("some-model", speculative="none")
    assert [c.speculative for c in configs] == ["prompt_lookup", "none"]
