"""The endpoints routers call on a worker (engine/server/worker_routes.py), on a real
server over a tiny random checkpoint: their shapes, the API key, and a flush that
really empties the prefix cache and its disk tier."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest

from engine.server import worker_routes
from engine.server.auth import key_salt
from tests.e2e.fixtures import API_KEY
from tests.e2e.replicas import http_counts, replica
from tests.e2e.scripted_engine import Script
from tests.engine import checkpoints

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = list(range(10, 106))  # token ids: six full pages to cache


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return checkpoints.tiny_llama(tmp_path_factory.mktemp("workers") / "tiny-worker")


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("worker-kv")


@pytest.fixture(scope="module")
def server(model_dir, disk_dir):
    config = dict(kv_cache_dtype="fp8_e4m3", kv_memory_gib=0.01, max_num_seqs=4)
    with replica(model_dir, API_KEY, kv_disk=True, kv_disk_dir=str(disk_dir), **config) as served:
        yield served


def get(server, path: str, **kwargs) -> httpx.Response:
    return httpx.get(server.url + path, headers=AUTH, timeout=60, **kwargs)


def stats(server) -> dict:
    return get(server, "/v1/engine/stats").json()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def cached_tokens(server, prompt: str | list[int] = PROMPT, **extra) -> int:
    reply = client(server).completions.create(
        model="tiny-worker", prompt=prompt, max_tokens=2, temperature=0, **extra
    )
    return reply.usage.prompt_tokens_details.cached_tokens


def test_model_info_names_the_model_and_its_files(server, model_dir):
    served_name = get(server, "/v1/models").json()["data"][0]["id"]
    info = get(server, "/model_info").json()
    assert get(server, "/get_model_info").json() == info
    assert info["model_path"] == info["tokenizer_path"] == str(model_dir.resolve())
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()
    assert info["served_model_name"] == served_name != "unknown"
    assert info["is_generation"] is True
    assert info["model_type"] == "llama"
    assert info["architectures"] == ["LlamaForCausalLM"]
    assert info["max_model_len"] == 512


def test_server_info_has_the_facts_routers_read(server):
    info = get(server, "/server_info").json()
    assert get(server, "/get_server_info").json() == info
    engine = stats(server)
    assert info["served_model_name"] == get(server, "/v1/models").json()["data"][0]["id"]
    assert info["model_path"] == get(server, "/model_info").json()["model_path"]
    assert (info["tp_size"], info["dp_size"], info["pp_size"], info["ep_size"]) == (1, 1, 1, 1)
    assert info["context_length"] == engine["max_context_tokens"] == 512
    assert info["max_total_num_tokens"] == info["max_total_tokens"] == engine["capacity_tokens"]
    assert info["max_running_requests"] == 4
    assert info["page_size"] == 16 and info["kv_cache_dtype"] == "fp8_e4m3"
    assert isinstance(info["version"], str) and info["version"]
    assert info["disable_radix_cache"] is False
    # sglang-router reads `model` as another spelling of the model id: both would void it.
    assert "model" not in info and "model_id" not in info
    assert API_KEY not in get(server, "/server_info").text


def test_get_load_in_sglangs_shape_idle_and_busy(server):
    idle = get(server, "/get_load").json()
    assert isinstance(idle, list) and len(idle) == 1
    entry = idle[0]
    assert entry["dp_rank"] == 0
    assert (entry["num_reqs"], entry["num_waiting_reqs"], entry["num_tokens"]) == (0, 0, 0)
    assert entry["kv_capacity_tokens"] == stats(server)["capacity_tokens"] > 0
    # A long request from another thread: polled while it runs, it holds KV. (Polled until
    # it runs, not merely arrives: the first poll can see it waiting for the scheduler.)
    body = dict(model="tiny-worker", prompt=PROMPT, max_tokens=400, extra_body={"ignore_eos": True})
    replies = []
    running = threading.Thread(
        target=lambda: replies.append(client(server).completions.create(**body))
    )
    running.start()
    try:
        busy = _poll_load(server, lambda entry: entry["num_running_reqs"] > 0, running)
    finally:
        running.join(timeout=120)
    assert replies and replies[0].usage.completion_tokens == 400
    assert busy["num_reqs"] == busy["num_running_reqs"] == 1 and busy["num_waiting_reqs"] == 0
    assert busy["num_tokens"] == busy["kv_used_tokens"] > 0
    assert 0 < busy["kv_usage"] <= 1


def _poll_load(server, wanted, running: threading.Thread) -> dict:
    while running.is_alive():
        entry = get(server, "/get_load").json()[0]
        if wanted(entry):
            return entry
    raise AssertionError("the request finished before /get_load saw it run")


def test_flush_empties_the_cache_and_its_disk_tier(server, disk_dir):
    cached_tokens(server)
    assert cached_tokens(server) > 0
    assert stats(server)["cached_tokens"] > 0
    # Saved to the disk tier too (what a stopping server does): the flush removes them.
    saved = asyncio.run(server.engine.save_prefix(PROMPT, key_salt(API_KEY)))  # cached per key
    assert saved > 0 and list(disk_dir.glob("*/pages/*.kvp"))

    assert httpx.post(server.url + "/flush_cache", timeout=60).status_code == 401
    assert get(server, "/flush_cache").status_code == 405
    reply = httpx.post(server.url + "/flush_cache", headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["success"] is True and body["message"].startswith("Cache flushed.")
    assert body["dropped"]["tokens"] > 0 and body["dropped"]["disk_pages"] == saved
    assert body["kept"] == {"in_use_tokens": 0}

    assert stats(server)["cached_tokens"] == 0
    assert list(disk_dir.glob("*/pages/*.kvp")) == []
    assert cached_tokens(server) == 0  # the next request computes its prompt again
    assert cached_tokens(server) > 0  # and caches it as usual


def test_health_generate_makes_one_token(server):
    reply = get(server, "/health_generate")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"status": "ok", "generated_tokens": 1}
    assert httpx.get(server.url + "/health_generate", timeout=60).status_code == 401
    assert httpx.get(server.url + "/health", timeout=60).status_code == 200  # open, as ever


def test_every_worker_route_needs_the_key(server):
    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        assert httpx.get(server.url + path, timeout=30).status_code == 401, path
    assert httpx.get(server.url + "/get_load", timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.get(server.url + "/get_load", headers=wrong, timeout=30).status_code == 401


def test_session_keys_are_accepted_and_share_the_cache(server):
    """The headers routers hash on, and OpenAI's `user`, are routing hints: the
    cache is not split by them (the salt is for tenants)."""
    first = {"X-Session-Id": "session-a", "X-SMG-Routing-Key": "session-a"}
    second = {"X-Session-Id": "session-b", "X-SMG-Routing-Key": "session-b"}
    prompt = "# a shared repository prefix\n" * 4
    cached_tokens(server, prompt, extra_headers=first, user="session-a")
    assert cached_tokens(server, prompt, extra_headers=second, user="session-b") > 0


def test_worker_routes_are_counted_by_name(server):
    get(server, "/get_load")
    counts = http_counts(server.url, API_KEY)
    assert counts.get(("/get_load", "200"), 0) >= 1
    assert counts.get(("/model_info", "200"), 0) >= 1
    assert not any(status == "404" for _, status in counts)


def test_health_generate_is_503_when_the_engine_cannot_answer(scripted, monkeypatch):
    """The failure paths, on the scripted engine: a full queue, a failed request, a stall."""
    url = scripted.url + "/health_generate"
    scripted.engine.push(Script([], overloaded=True))
    full = httpx.get(url, headers=AUTH, timeout=30)
    assert full.status_code == 503 and full.json()["error"]["code"] == "overloaded"
    scripted.engine.push(Script(["x"], error="the step failed"))
    failed = httpx.get(url, headers=AUTH, timeout=30)
    assert failed.status_code == 503 and "the step failed" in failed.text
    monkeypatch.setattr(worker_routes, "HEALTH_GENERATE_TIMEOUT_S", 0.2)
    scripted.engine.push(Script(["a", "b", "c"], delay=2.0))
    stalled = httpx.get(url, headers=AUTH, timeout=30)
    assert stalled.status_code == 503 and stalled.json()["error"]["code"] == "engine_unresponsive"
    assert not scripted.engine.active  # the health request was aborted, not left running
