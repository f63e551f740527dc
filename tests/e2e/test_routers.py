"""Two Resident replicas behind the routers people run, each the real binary from its
PyPI wheel (sglang-router 0.3.2, vllm-router 0.1.17): workers register under the
model's name, chat and completions (streamed or not) pass through, a flush reaches
every replica, load is read, requests of one session stay on one replica, and no
router asks a replica for anything it does not answer.

The replicas share one module (they start once); each router is a child process on a
free port, stopped by its PID whatever a test did. The replicas have no API key:
vllm-router sends none on /get_load and /flush_cache (engine/server/worker_routes.py);
sglang-router, which sends its --api-key everywhere, is also checked against a replica
that needs one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sys
from pathlib import Path

import httpx
import openai
import pytest

from agent.core.clients import ChatRequest, HTTPClient
from tests.e2e.replicas import RouterExited, RouterProcess, free_ports, http_counts, replica
from tests.engine import checkpoints

REPLICA_CONFIG = dict(kv_cache_dtype="fp8_e4m3", kv_memory_gib=0.01, max_num_seqs=4)
CHAT = "/v1/chat/completions"
ROUTER_KEY = "router-worker-key"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return checkpoints.tiny_llama(tmp_path_factory.mktemp("routed") / "tiny-routed")


@pytest.fixture(scope="module")
def replicas(model_dir):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(replica(model_dir, None, **REPLICA_CONFIG)) for _ in range(2)]


@pytest.fixture(scope="module")
def answered(replicas):
    """(method, path, status) of every request the replicas answered from here on (uvicorn's
    access log: it names the path, where /metrics folds unknown paths into "other")."""
    with access_log() as records:
        yield records


def sglang_router(urls: list[str], policy: str, log: Path, api_key: str | None = None):
    port, metrics_port = free_ports(2)
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--policy", policy, "--worker-urls", *urls]
    command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    command += ["--log-level", "info"] + (["--api-key", api_key] if api_key else [])
    return RouterProcess(command, port, log)


def vllm_router(urls: list[str], policy: str, log: Path):
    port, metrics_port = free_ports(2)
    command = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--policy", policy, "--worker-urls", *urls]
    command += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    return RouterProcess(command, port, log)


def healthy_workers(url: str, count: int, named: bool, headers: dict | None = None) -> bool:
    reply = httpx.get(url + "/workers", headers=headers, timeout=5)
    workers = reply.json().get("workers", []) if reply.status_code == 200 else []
    healthy = [w for w in workers if w.get("is_healthy")]
    return len(healthy) == count and all(w["model_id"] != "unknown" for w in healthy if named)


@contextlib.contextmanager
def running(start, workers: int, named: bool, headers: dict | None = None, attempts: int = 3):
    """The router `start()` gives, once it has registered `workers` healthy workers. A
    router that exits at once is started again on other ports: a port found free can be
    taken (by any process's outgoing connection) before the router binds it."""
    for attempt in range(attempts):
        router = start()
        try:
            router.wait_ready(lambda url: healthy_workers(url, workers, named, headers))
        except RouterExited:
            router.stop()
            if attempt + 1 == attempts:
                raise
            continue
        except BaseException:
            router.stop()
            raise
        break
    try:
        yield router
    finally:
        router.stop()


ROUTERS = {
    # name: (start, policy, sglang: registers workers under the name /server_info gives)
    "sglang-cache_aware": (sglang_router, "cache_aware", True),
    "sglang-manual": (sglang_router, "manual", True),
    "vllm-consistent_hash": (vllm_router, "consistent_hash", False),
}


@pytest.fixture(scope="module", params=sorted(ROUTERS))
def router(request, replicas, answered, tmp_path_factory):
    start, policy, named = ROUTERS[request.param]
    log = tmp_path_factory.mktemp("router") / f"{request.param}.log"
    with running(lambda: start([r.url for r in replicas], policy, log), 2, named) as process:
        process.name = request.param
        yield process


def model_name(replicas) -> str:
    return httpx.get(replicas[0].url + "/v1/models", timeout=30).json()["data"][0]["id"]


def test_the_router_lists_the_model_by_its_name(router, replicas, model_dir):
    listed = httpx.get(router.url + "/v1/models", timeout=30).json()["data"]
    assert [entry["id"] for entry in listed] == [model_name(replicas)]
    if router.name.startswith("sglang"):  # vllm-router 0.1.17 asks workers for no metadata
        workers = httpx.get(router.url + "/workers", timeout=30).json()["workers"]
        assert {w["model_id"] for w in workers} == {model_name(replicas)}
        for worker in workers:
            facts = worker["metadata"]
            assert facts["model_path"] == str(model_dir.resolve())
            assert (facts["model_type"], facts["tp_size"], facts["dp_size"]) == ("llama", "1", "1")


def test_what_the_router_passes_through_is_answered(router, replicas):
    model = httpx.get(router.url + "/get_model_info", timeout=30)
    assert model.status_code == 200 and model.json()["served_model_name"] == model_name(replicas)
    for path in ("/get_server_info", "/health_generate"):  # sglang-router answers these itself
        assert httpx.get(router.url + path, timeout=60).status_code == 200, path


def test_chat_and_completions_pass_through_streamed_or_not(router, replicas):
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    name = model_name(replicas)
    messages = [{"role": "user", "content": "Say hi."}]
    chat = client.chat.completions.create(model=name, messages=messages, max_tokens=3)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    chunks = list(
        client.chat.completions.create(
            model=name,
            messages=messages,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    text = client.completions.create(model=name, prompt="def add(a, b):", max_tokens=3)
    assert text.choices[0].finish_reason in ("stop", "length")
    streamed = list(
        client.completions.create(model=name, prompt="def add(a, b):", max_tokens=3, stream=True)
    )
    assert streamed and streamed[-1].choices[0].finish_reason in ("stop", "length")


def test_a_flush_through_the_router_empties_every_replica(router, replicas):
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    prompt = "def add(a, b):\n    return a + b\n" * 4  # a few pages of bytes
    for _ in range(2):  # cached somewhere
        client.completions.create(model=model_name(replicas), prompt=prompt, max_tokens=1)
    assert sum(_stats(r)["cached_tokens"] for r in replicas) > 0
    reply = httpx.post(router.url + "/flush_cache", timeout=60)
    assert reply.status_code == 200, reply.text
    assert [_stats(r)["cached_tokens"] for r in replicas] == [0, 0]


def test_the_router_reads_each_replicas_load(router, replicas):
    before = [http_counts(r.url).get(("/get_load", "200"), 0) for r in replicas]
    loads = httpx.get(router.url + "/get_loads", timeout=60).json()["workers"]
    assert sorted(w["worker"] for w in loads) == sorted(r.url for r in replicas)
    after = [http_counts(r.url).get(("/get_load", "200"), 0) for r in replicas]
    assert all(a > b for a, b in zip(after, before, strict=True))  # each replica answered
    if router.name.startswith("sglang"):
        assert all(w["load"] >= 0 for w in loads)
    else:  # vllm-router 0.1.17 reads {"load": N} at the path SGLang answers with a list
        assert all(w["load"] == -1 for w in loads)


def test_one_session_stays_on_one_replica(router, replicas):
    """By its key (sglang-router's manual policy, vllm-router's consistent_hash), or by
    the prefix its requests share (cache_aware)."""
    placed = {}
    for index in range(12):
        key = f"20250101-0000{index:02d}-abcdef"
        before = [_chats(r) for r in replicas]
        asyncio.run(_session_requests(router.url, model_name(replicas), key, 2))
        after = [_chats(r) for r in replicas]
        deltas = [a - b for a, b in zip(after, before, strict=True)]
        assert sorted(deltas) == [0, 2], (key, deltas)  # both turns on one replica
        placed[key] = deltas.index(2)
    if router.name != "sglang-cache_aware":  # which replica a new prefix starts on is its call
        # Twelve keys all on one of two replicas: 1 in 2,048 for a fair hash.
        assert set(placed.values()) == {0, 1}  # keys hash over both replicas


def test_the_agent_attaches_through_the_router(router, replicas):
    """No --context-window needed: vllm-router passes /v1/engine/stats through;
    sglang-router does not, but hands /get_model_info to a replica."""

    async def attach() -> tuple[str, int]:
        client = HTTPClient(router.url)
        try:
            return await client.resolve_model(), await client.context_window()
        finally:
            await client.aclose()

    assert asyncio.run(attach()) == (model_name(replicas), 512)


def test_no_router_request_went_unanswered(router, answered):
    log = router.log()
    assert " 404" not in log and "404 Not Found" not in log, log[-3000:]
    assert "returned 404" not in log and "falling back" not in log
    assert answered  # the log was captured
    # sglang-router first tries each worker as a gRPC server (an HTTP/2 preface, `PRI *`):
    # that probe, not an endpoint, is the only thing allowed a 404.
    unanswered = [r for r in answered if r[2] == 404 and r[:2] != ("PRI", "*")]
    assert unanswered == []


def test_sglang_router_with_an_api_key(model_dir, tmp_path):
    """sglang-router sends its --api-key to the workers; a replica that needs one serves it."""
    with replica(model_dir, ROUTER_KEY, **REPLICA_CONFIG) as keyed:
        log = tmp_path / "keyed.log"
        auth = {"Authorization": f"Bearer {ROUTER_KEY}"}
        start = lambda: sglang_router([keyed.url], "cache_aware", log, ROUTER_KEY)  # noqa: E731
        with running(start, 1, True, auth) as router:
            listed = httpx.get(router.url + "/v1/models", headers=auth, timeout=30).json()
            assert [m["id"] for m in listed["data"]] == [model_name_of(keyed)]
            loads = httpx.get(router.url + "/get_loads", headers=auth, timeout=30).json()
            assert [w["load"] for w in loads["workers"]] == [0]
            flushed = httpx.post(router.url + "/flush_cache", headers=auth, timeout=60)
            assert flushed.status_code == 200, flushed.text
            client = openai.OpenAI(base_url=router.url + "/v1", api_key=ROUTER_KEY, max_retries=0)
            reply = client.completions.create(model=model_name_of(keyed), prompt="hi", max_tokens=2)
            assert reply.usage.completion_tokens >= 1
            assert " 401" not in router.log() and " 404" not in router.log()


@contextlib.contextmanager
def access_log():
    records: list[tuple[str, str, int]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            _, method, path, _, status = record.args
            records.append((method, path, int(status)))

    logger, handler = logging.getLogger("uvicorn.access"), Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def model_name_of(served) -> str:
    headers = {"Authorization": f"Bearer {ROUTER_KEY}"}
    return httpx.get(served.url + "/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]


def _stats(served) -> dict:
    return httpx.get(served.url + "/v1/engine/stats", timeout=30).json()


def _chats(served) -> int:
    return http_counts(served.url).get((CHAT, "200"), 0)


async def _session_requests(url: str, model: str, key: str, count: int) -> None:
    """`count` turns of one session through the agent's own client, bound to `key`, each
    prompt starting with the session's own resident prefix (its "repository")."""
    client = HTTPClient(url, model=model, context_window=512)
    client.bind_session(key)
    files = [hashlib.sha256(f"{key}/{n}".encode()).hexdigest() for n in range(4)]
    system = {"role": "system", "content": "\n".join(files)}  # unlike any other session's
    try:
        for turn in range(count):
            request = ChatRequest(
                [system, {"role": "user", "content": f"turn {turn}"}], max_tokens=2
            )
            async for _ in client.stream(request):
                pass
    finally:
        await client.aclose()
