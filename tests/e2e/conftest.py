"""Servers for the e2e tests: scripted (no model), tiny random checkpoint, and the default model.

Each is started once per session on a free loopback port with the real
uvicorn server in a thread, and the tests talk to it over HTTP with the
official `openai` client (or httpx where the raw protocol matters).
"""

from __future__ import annotations

import openai
import pytest

from engine.server.app import create_app
from engine.server.background import BackgroundServer
from engine.server.served_model import ServedModel
from tests.e2e.fixtures import API_KEY, default_model_present, hermes_tokenizer, served
from tests.e2e.scripted_engine import ScriptedEngine
from tests.engine import checkpoints


@pytest.fixture(scope="session")
def hermes_tok(tmp_path_factory):
    return hermes_tokenizer(tmp_path_factory.mktemp("hermes-tokenizer"))


@pytest.fixture(scope="session")
def scripted_server(hermes_tok):
    """A scripted engine behind the real app, with an API key (so salts are per key)."""
    engine = ScriptedEngine()
    app = create_app(engine, served(hermes_tok), api_key=API_KEY)
    with BackgroundServer(app) as server:
        server.engine = engine
        yield server


@pytest.fixture
def scripted(scripted_server):
    """The scripted server with its script queue and request log emptied."""
    scripted_server.engine.queue.clear()
    scripted_server.engine.submitted.clear()
    return scripted_server


def client_for(server, api_key: str | None = API_KEY, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key=api_key or "unused", max_retries=0, **kwargs
    )


def _engine_server(model: str, api_key: str | None, **config):
    """The engine as `resident serve` builds it (AsyncEngine.open: an FP8 cache without
    fixed scales is calibrated on the built-in sample before the first request)."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig

    engine = AsyncEngine.open(EngineConfig(model=str(model), **config))
    try:
        app = create_app(engine, ServedModel.from_engine(engine, str(model)), api_key=api_key)
        server = BackgroundServer(app)
    except BaseException:
        engine.shutdown()
        raise
    server.engine = engine
    return server


def _serving(server):
    """Run the server for the session; its engine is shut down whatever happens,
    a server that failed to start included."""
    try:
        with server:
            yield server
    finally:
        server.engine.shutdown()


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """A tiny random Llama (context 512) behind the app, with an API key."""
    model_dir = checkpoints.tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    server = _engine_server(
        model_dir, API_KEY, kv_cache_dtype="fp8_e4m3", kv_memory_gib=0.01, max_waiting=4096
    )
    yield from _serving(server)


def _default_server(kv_cache_dtype: str, kv_memory_gib: float):
    if not default_model_present():
        pytest.skip("the default model is not pulled (run `resident models pull` / make setup)")
    server = _engine_server(
        "smollm2-135m-instruct", None, kv_cache_dtype=kv_cache_dtype, kv_memory_gib=kv_memory_gib
    )
    return server


@pytest.fixture(scope="session")
def fp8_server():
    yield from _serving(_default_server("fp8_e4m3", 0.25))


@pytest.fixture(scope="session")
def bf16_server():
    yield from _serving(_default_server("bf16", 0.25))


@pytest.fixture(params=["bf16", "fp8_e4m3"])
def default_server(request):
    """The default model with BF16 KV, then with FP8 KV."""
    name = "bf16_server" if request.param == "bf16" else "fp8_server"
    return request.getfixturevalue(name)
