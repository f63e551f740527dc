"""The garbage collector held off while an engine starts (engine/host/start_up_collector.py):
off inside, as it was after (on error too, and never turned on for a caller who had it
off), and a server's release freezing what start-up made."""

from __future__ import annotations

import gc

import pytest
from typer.testing import CliRunner

from engine.cli import engine_app
from engine.config import EngineConfig
from engine.host import start_up_collector


@pytest.fixture(autouse=True)
def _collector_restored():
    enabled = gc.isenabled()
    gc.unfreeze()  # a freeze from an earlier test in this process must not count here
    yield
    gc.unfreeze()
    start_up_collector._held = False
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_held_pauses_collection_and_restores_it():
    gc.enable()
    with start_up_collector.held():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_held_restores_on_error():
    gc.enable()
    with pytest.raises(RuntimeError), start_up_collector.held():
        raise RuntimeError("a load that failed")
    assert gc.isenabled()


def test_held_leaves_a_disabled_collector_disabled():
    gc.disable()
    with start_up_collector.held():
        pass
    assert not gc.isenabled()


def test_release_freezes_what_start_up_made():
    gc.enable()
    gc.unfreeze()
    start_up_collector.hold()
    assert not gc.isenabled()
    survivor = [object() for _ in range(10)]  # what a start-up keeps
    start_up_collector.release(freeze=True)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(survivor)


def test_release_without_hold_changes_nothing():
    gc.disable()
    start_up_collector.release(freeze=True)
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_hold_is_a_no_op_when_the_caller_disabled_collection():
    gc.disable()
    start_up_collector.hold()
    start_up_collector.release(freeze=False)
    assert not gc.isenabled()  # the caller's choice stands


def test_engine_build_runs_without_collections(monkeypatch):
    from engine.core import engine_parts, llm_engine

    seen = []

    def resolve(model):
        seen.append(gc.isenabled())
        raise RuntimeError("stop after the check")

    monkeypatch.setattr(engine_parts, "resolve_model", resolve)
    gc.enable()
    for _ in range(2):  # the decorator holds it on every build
        with pytest.raises(RuntimeError):
            llm_engine.LLMEngine(EngineConfig(model="m"))
    assert seen == [False, False]
    assert gc.isenabled()


def test_a_serve_that_fails_before_serving_gives_collection_back():
    gc.enable()
    # A non-loopback bind without an API key is refused before anything loads.
    result = CliRunner().invoke(
        engine_app, ["serve", "--model", "x.gguf", "--host", "0.0.0.0", "--port", "8123"]
    )
    assert result.exit_code == 2, result.output
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
