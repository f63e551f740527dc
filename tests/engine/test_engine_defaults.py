"""`LLM(model)` runs the engine `resident serve` runs: same attention backend, same CPU kernels.

Both take what they are not told from EngineConfig's defaults (engine.config.
engine_settings); an explicit choice still wins.
"""

from __future__ import annotations

import inspect

import pytest

from agent.cli import serve as serve_command
from engine import LLM
from engine.config import PERFORMANCE_SETTINGS, EngineConfig, default_setting, engine_settings
from engine.server.launch import ServeOptions, build_engine


def test_llm_serve_options_and_the_serve_command_share_the_defaults():
    llm_signature = inspect.signature(LLM.__init__).parameters
    command = inspect.signature(serve_command).parameters
    for name in PERFORMANCE_SETTINGS:
        default = default_setting(name)
        assert getattr(ServeOptions(model="m"), name) == default, name
        assert command[name].default.default == default, name  # the typer option's default
        # LLM leaves them unset (None, or not a named argument), so EngineConfig's applies.
        assert name not in llm_signature or llm_signature[name].default is None, name
    assert default_setting("attention_backend") == "auto"


def test_engine_settings_leave_unset_options_to_the_config():
    settings = engine_settings(model="m", attention_backend=None, kv_memory_gib=None, seed=3)
    assert settings == {"model": "m", "seed": 3}
    assert EngineConfig(**settings).attention_backend == default_setting("attention_backend")


@pytest.fixture(scope="module")
def served_engine(tiny_llama_dir):
    engine = build_engine(
        ServeOptions(model=str(tiny_llama_dir), dtype="bfloat16", kv_memory_gib=0.01)
    )
    yield engine.engine
    engine.shutdown()


def test_llm_picks_what_serve_picks(tiny_llama_dir, served_engine):
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_memory=0.01)
    for name in PERFORMANCE_SETTINGS:
        assert getattr(llm.config, name) == getattr(served_engine.config, name), name
    assert llm.engine.runner.backend.name == served_engine.runner.backend.name
    assert llm.engine.cpu_kernel == served_engine.cpu_kernel
    assert llm.engine.stats()["attention_backend"] == served_engine.stats()["attention_backend"]


def test_an_explicit_backend_still_wins(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", attention_backend="torch", kv_memory=0.01)
    assert llm.config.attention_backend == "torch"
    assert llm.engine.runner.backend.name == "torch"
