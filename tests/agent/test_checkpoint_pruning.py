"""Old checkpoints are pruned when a session opens; the newest stay for /undo."""

from __future__ import annotations

import asyncio
import logging

import agent.core.runtime
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.session import data_dir
from tests.agent.scripted_server import ScriptedServer
from tools import open_checkpoint_store


def open_and_close(server) -> None:
    async def scenario():
        runtime = await open_runtime(RuntimeOptions(attach=server.url), [])
        await runtime.close()

    asyncio.run(scenario())


def test_opening_a_session_keeps_only_the_newest_checkpoints(repo, monkeypatch):
    monkeypatch.setattr(agent.core.runtime, "KEEP_CHECKPOINTS", 2)
    store = open_checkpoint_store(repo, data_dir())
    for number in range(4):
        (repo / "calc.py").write_text(f"# edit {number}\n")
        store.create(f"edit {number}")
    with ScriptedServer([]) as server:
        open_and_close(server)
    assert [c.label for c in store.list()] == ["edit 2", "edit 3"]


def test_checkpoints_off_means_nothing_is_pruned(repo, monkeypatch):
    monkeypatch.setattr(agent.core.runtime, "KEEP_CHECKPOINTS", 1)
    store = open_checkpoint_store(repo, data_dir())
    store.create("one")
    store.create("two")

    async def scenario(server):
        options = RuntimeOptions(attach=server.url, checkpoints=False)
        runtime = await open_runtime(options, [])
        await runtime.close()

    with ScriptedServer([]) as server:
        asyncio.run(scenario(server))
    assert [c.label for c in store.list()] == ["one", "two"]


def test_a_failing_prune_does_not_stop_the_session(repo, monkeypatch, caplog):
    def broken(store, keep):
        raise OSError("disk says no")

    monkeypatch.setattr(agent.core.runtime, "prune", broken)
    with caplog.at_level(logging.WARNING, logger="agent.core.runtime"):
        with ScriptedServer([]) as server:
            open_and_close(server)
    assert "could not prune old checkpoints: disk says no" in caplog.text
