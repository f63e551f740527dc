"""vllm-router's kv_aware policy on Resident's KV events (issue 40): a returning session
goes to the replica that holds its prefix.

Two `resident serve` replicas (a tiny random Llama, each with `--kv-events` on its
own port) behind the real vllm-router (the PyPI wheel, `--policy kv_aware`): the
router subscribes to both streams, indexes the blocks each replica stores, and
scores a request by the longest prefix a replica holds. Agent-shaped traffic: a few
long shared prefixes (a repository snapshot each), a first question per prefix,
then the returning questions, one at a time, each asked through the router.

Two routers over the same replicas, one test each, each starting from flushed
replicas:

- completions with token-id prompts (taken by the router as they are), the router
  told each worker's stream (`--kv-event-source`). The first questions go through
  the router at once (it spreads them by load: nothing is cached yet); which replica
  took which prefix is read from their /v1/engine/stats (the prefixes are 4, 5, 7
  and 13 pages long, every subset has its own sum, and a question with its answer
  stays within a partial page, so a replica's cached tokens name its prefixes);
- chats through the openai client, the router finding each stream itself
  (/get_server_info's kv_block_size, /kv_event_sources) and getting each chat's
  token ids from the replicas' /v1/chat/completions/render
  (engine/server/tokenize_routes.py): the ids the engine prefills, so the blocks it
  hashes are the blocks the engine reports. The first chats go straight to the
  replicas, alternately, so the holder of each prefix is known.

Which replica served a returning request: their request counters (/metrics).
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations
from pathlib import Path

import httpx
import openai
import pytest

from tests.engine.checkpoints import tiny_llama

pytest.importorskip("vllm_router")

PAGE = 16
PAGES = (4, 5, 7, 13)  # prefix lengths in pages: no two subsets have the same sum
QUESTIONS = 5  # per prefix, the first one included
QUESTION_TOKENS = 10  # + 2 generated: within the prefix's next page, which stays uncached
TARGET = 0.95
CHAT_LINES = (3, 5, 7, 9)  # a repository per chat prefix, this many lines long
CONTEXT = 512  # the tiny model's


def route_count(route: str) -> re.Pattern:
    return re.compile(
        rf'^resident_http_requests_total\{{route="{re.escape(route)}",status="200"\}} (\S+)$',
        re.M,
    )


COMPLETIONS = route_count("/v1/completions")
CHATS = route_count("/v1/chat/completions")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    """A child process with its output in a log file, stopped by its PID."""

    def __init__(self, command: list[str], log_path: Path, env: dict | None = None):
        self.log_path = log_path
        with log_path.open("w") as log:
            self.popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log_path.read_text(errors="replace"))

    def wait_for(self, url: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.popen.poll() is None, f"exited ({self.popen.returncode}):\n{self.log()}"
            assert time.monotonic() < deadline, f"not ready in {timeout_s:g} s:\n{self.log()}"
            time.sleep(0.25)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)


class Cluster:
    def __init__(self, router: str, workers: list[str], model: str, processes: list[Process]):
        self.router, self.workers, self.model, self.processes = router, workers, model, processes


class Replicas:
    def __init__(self, workers: list[str], sources: list[str], model: str, tmp: Path):
        self.workers, self.sources, self.model, self.tmp = workers, sources, model, tmp

    def flush(self) -> None:
        """Empty every replica's prefix cache (each reports AllBlocksCleared)."""
        for url in self.workers:
            reply = httpx.post(url + "/flush_cache", timeout=60)
            assert reply.status_code == 200 and reply.json()["success"], reply.text


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Two replicas publishing KV events; stopped by their PIDs whatever the tests did."""
    tmp = tmp_path_factory.mktemp("kv-aware")
    model = tiny_llama(tmp / "tiny-llama")
    env = {**os.environ, "RESIDENT_CACHE_DIR": str(tmp / "cache"), "RESIDENT_API_KEY": ""}
    resident = str(Path(sys.executable).parent / "resident")
    processes: list[Process] = []
    try:
        workers, sources = [], []
        for i in range(2):
            port, events = free_port(), free_port()
            command = [resident, "serve", "--model", str(model), "--port", str(port)]
            command += ["--dtype", "float32", "--kv-cache-dtype", "auto", "--no-kv-disk"]
            command += ["--kv-events", f"tcp://127.0.0.1:{events}"]
            processes.append(Process(command, tmp / f"replica{i}.log", env))
            workers.append(f"http://127.0.0.1:{port}")
            sources.append(f"{workers[-1]}=tcp://127.0.0.1:{events}")
        for process, url in zip(processes, workers, strict=True):
            process.wait_for(url + "/health")
        yield Replicas(workers, sources, str(model), tmp)
    finally:
        for process in reversed(processes):
            process.stop()


def start_router(replicas: Replicas, name: str, static_sources: bool) -> tuple[Process, str, str]:
    """vllm-router's kv_aware over the replicas: (process, its URL, its metrics URL)."""
    router_port, metrics_port = free_port(), free_port()
    command = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1"]
    command += ["--port", str(router_port), "--worker-urls", *replicas.workers]
    command += ["--policy", "kv_aware", "--prometheus-port", str(metrics_port)]
    if static_sources:
        command += ["--kv-event-block-size", str(PAGE), "--kv-event-model", "tiny-llama"]
        for source in replicas.sources:
            command += ["--kv-event-source", source]
    command += ["--log-level", "debug"]
    router = Process(command, replicas.tmp / f"{name}.log")
    return router, f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="module")
def cluster(replicas):
    """The router told each worker's KV-event stream (`--kv-event-source`)."""
    router, url, _ = start_router(replicas, "router", static_sources=True)
    try:
        router.wait_for(url + "/health", timeout_s=60)
        yield Cluster(url, replicas.workers, replicas.model, [router])
    finally:
        router.stop()


@pytest.fixture(scope="module")
def discovering(replicas):
    """The router finding each worker's stream itself (/get_server_info, /kv_event_sources),
    started on flushed replicas: it indexes every block they store from here on."""
    replicas.flush()
    router, url, metrics = start_router(replicas, "discovering-router", static_sources=False)
    try:
        router.wait_for(url + "/health", timeout_s=60)
        deadline = time.monotonic() + 60
        while router.log().count("spawned subscriber") < len(replicas.workers):
            assert router.popen.poll() is None, router.log()
            assert time.monotonic() < deadline, f"no KV-event subscribers:\n{router.log()}"
            time.sleep(0.1)
        time.sleep(0.3)  # the subscriptions reach the publishers (ZMQ's slow joiner)
        cluster = Cluster(url, replicas.workers, replicas.model, [router])
        cluster.metrics = metrics
        yield cluster
    finally:
        router.stop()


def complete(cluster: Cluster, prompt: list[int]) -> dict:
    reply = httpx.post(
        cluster.router + "/v1/completions",
        json={"model": cluster.model, "prompt": prompt, "max_tokens": 2, "temperature": 0},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]


def cached(usage: dict) -> int:
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def served(cluster: Cluster, pattern: re.Pattern = COMPLETIONS) -> list[int]:
    """Requests each replica has answered (completions, or what `pattern` counts)."""
    counts = []
    for url in cluster.workers:
        text = httpx.get(url + "/metrics", timeout=30).text
        counts.append(int(sum(float(m) for m in pattern.findall(text))))
    return counts


def routed_to(cluster: Cluster, before: list[int], pattern: re.Pattern = COMPLETIONS) -> int:
    """The replica whose counter moved since `before` (waiting a moment for it)."""
    after = served(cluster, pattern)
    deadline = time.monotonic() + 10
    while sum(after) == sum(before) and time.monotonic() < deadline:
        time.sleep(0.05)
        after = served(cluster, pattern)
    (routed,) = [r for r in range(len(after)) if after[r] > before[r]]
    return routed


def holdings(cluster: Cluster) -> list[set[int]]:
    """Which prefixes (indexes into PAGES) each replica's prefix cache holds."""
    out = []
    for url in cluster.workers:
        tokens = httpx.get(url + "/v1/engine/stats", timeout=30).json()["cached_tokens"]
        subsets = [
            set(subset)
            for size in range(len(PAGES) + 1)
            for subset in combinations(range(len(PAGES)), size)
            if sum(PAGES[i] for i in subset) * PAGE == tokens
        ]
        assert len(subsets) == 1, f"{url} caches {tokens} tokens: no set of prefixes adds up"
        out.append(subsets[0])
    return out


def test_returning_sessions_go_to_the_replica_holding_their_prefix(replicas, cluster):
    replicas.flush()
    rng = random.Random(40)
    prefixes = [[rng.randrange(3, 320) for _ in range(PAGE * n)] for n in PAGES]

    def question() -> list[int]:
        return [rng.randrange(3, 320) for _ in range(QUESTION_TOKENS)]

    firsts = [p + question() for p in prefixes]
    with ThreadPoolExecutor(len(prefixes)) as pool:
        usages = list(pool.map(lambda prompt: complete(cluster, prompt), firsts))
    assert [cached(u) for u in usages] == [0] * len(prefixes)
    held = holdings(cluster)
    holder = {i: r for r, prefixes_held in enumerate(held) for i in prefixes_held}
    assert sorted(holder) == list(range(len(prefixes))), held  # each on exactly one replica
    assert all(held), f"the first questions were not spread: {held}"

    hits, total = 0, 0
    for _ in range(QUESTIONS - 1):
        for i, prefix in enumerate(prefixes):
            before = served(cluster)
            usage = complete(cluster, prefix + question())
            routed = routed_to(cluster, before)
            total += 1
            if routed == holder[i]:
                hits += 1
                assert cached(usage) == len(prefix)
    share = hits / total
    router_log = cluster.processes[-1].log()
    decisions = router_log.count("KV prefix decision")
    print(
        f"kv_aware: {hits}/{total} returning questions on the holding replica ({share:.0%}); "
        f"{decisions} router decisions logged"
    )
    assert share >= TARGET, router_log[-4000:]
    assert "decode batch" not in router_log  # every batch of events was understood


# ----- chats: the router asks the replicas for each chat's token ids -------------------------


def repository(rng: random.Random, index: int, lines: int) -> str:
    """A system message holding a made-up repository snapshot."""
    body = "".join(
        f"src/pkg{index}/mod{k}.py: def fn{k}(x): return x * {rng.randrange(2, 99)}\n"
        for k in range(lines)
    )
    return f"You are a coding agent. The repository {index}:\n{body}"


def ask(cluster: Cluster, client: openai.OpenAI, system: str, question: str) -> int:
    """Ask through the router; the answer's cached prompt tokens."""
    reply = client.chat.completions.create(
        model=cluster.model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=2,
        temperature=0,
    )
    return cached(reply.usage.model_dump())


def chat(cluster: Cluster, client: openai.OpenAI, system: str, question: str) -> tuple[int, int]:
    """Ask through the router, alone; (the replica that answered, its cached prompt tokens)."""
    before = served(cluster, CHATS)
    cached_tokens = ask(cluster, client, system, question)
    return routed_to(cluster, before, CHATS), cached_tokens


def tokenize(cluster: Cluster, system: str, question: str) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    reply = httpx.post(cluster.workers[0] + "/tokenize", json={"messages": messages}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["tokens"]


def common(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_returning_chat_sessions_go_to_the_replica_holding_their_prefix(discovering):
    """The first chat of each prefix goes straight to a replica (alternately), so which
    replica holds what is known; the router learns it from their KV events alone. Every
    prefix begins with the same agent preamble (a few pages both replicas come to hold),
    so the router must prefer the longer match, not just any."""
    cluster = discovering
    rng = random.Random(41)
    systems = [repository(rng, i, lines) for i, lines in enumerate(CHAT_LINES)]

    def question(i: int, k: int) -> str:
        n = rng.randrange(1, 999)
        return f"Question {k}: what does fn{k} in src/pkg{i}/mod{k}.py return for x = {n}?"

    def client(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    firsts = [(system, question(i, 0)) for i, system in enumerate(systems)]
    assert max(len(tokenize(cluster, *first)) for first in firsts) + 2 <= CONTEXT
    holder = {i: i % len(cluster.workers) for i in range(len(firsts))}
    with ThreadPoolExecutor(len(firsts)) as pool:
        list(
            pool.map(lambda i: ask(cluster, client(cluster.workers[holder[i]]), *firsts[i]), holder)
        )
    preamble = common(tokenize(cluster, *firsts[0]), tokenize(cluster, *firsts[1]))
    assert preamble >= 2 * PAGE  # the shared part a replica not holding a prefix also has

    router = client(cluster.router)
    hits, total = 0, 0
    for k in range(1, QUESTIONS):
        for i, system in enumerate(systems):
            asked = question(i, k)
            routed, cached_tokens = chat(cluster, router, system, asked)
            total += 1
            if routed == holder[i]:
                hits += 1
                shared = common(tokenize(cluster, system, asked), tokenize(cluster, *firsts[i]))
                assert cached_tokens >= shared // PAGE * PAGE > 0
    share = hits / total
    router_log = cluster.processes[-1].log()
    metrics = httpx.get(cluster.metrics, timeout=30).text
    rendered = re.findall(
        r'^vllm_router_kv_routing_inputs_total\{[^}]*result="render"[^}]*\} (\S+)$', metrics, re.M
    )
    print(
        f"kv_aware (chat): {hits}/{total} returning chats on the holding replica ({share:.0%}); "
        f"token ids rendered {sum(float(v) for v in rendered):g} times"
    )
    assert share >= TARGET, router_log[-4000:]
    assert sum(float(v) for v in rendered) >= 2 * total  # both replicas asked, every chat
    assert "decode batch" not in router_log
