"""vllm-router's kv_aware policy on Resident's KV events (issue 40): a returning session
goes to the replica that holds its prefix.

Two `resident serve` replicas (a tiny random Llama, each with `--kv-events` on its
own port) behind the real vllm-router (the PyPI wheel, `--policy kv_aware`, one
static `--kv-event-source` per worker): the router subscribes to both streams,
indexes the blocks each replica stores, and scores a request by the longest
prefix a replica holds. Agent-shaped traffic: a few long shared prefixes (a
repository snapshot each), the first question of every prefix sent at once (so
the router spreads them by load: nothing is cached yet), then the returning
questions, one at a time, each asked through the router.

The requests are completions with token-id prompts: vllm-router 0.1.17 takes
those as they are, while for a text or chat prompt it needs the worker's
/v1/completions/render (or /tokenize), which Resident does not serve.

Which replica holds which prefix is read from their /v1/engine/stats: the
prefixes are 4, 5, 7 and 13 pages long, every subset has its own sum, and a
question with its answer stays within a partial page, so a replica's cached
tokens name its prefixes. Which replica served a request is read from their
request counters (/metrics).
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
import pytest

from tests.engine.checkpoints import tiny_llama

pytest.importorskip("vllm_router")

PAGE = 16
PAGES = (4, 5, 7, 13)  # prefix lengths in pages: no two subsets have the same sum
QUESTIONS = 5  # per prefix, the first one included
QUESTION_TOKENS = 10  # + 2 generated: within the prefix's next page, which stays uncached
TARGET = 0.95
COMPLETIONS = re.compile(
    r'^resident_http_requests_total\{route="/v1/completions",status="200"\} (\S+)$', re.M
)


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two replicas publishing KV events and vllm-router's kv_aware in front of them;
    every process is stopped by its PID whatever the tests did."""
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
        router_port = free_port()
        command = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1"]
        command += ["--port", str(router_port), "--worker-urls", *workers]
        command += ["--policy", "kv_aware", "--kv-event-block-size", str(PAGE)]
        command += ["--kv-event-model", "tiny-llama", "--prometheus-port", str(free_port())]
        for source in sources:
            command += ["--kv-event-source", source]
        command += ["--log-level", "debug"]
        router = Process(command, tmp / "router.log")
        processes.append(router)
        router.wait_for(f"http://127.0.0.1:{router_port}/health", timeout_s=60)
        yield Cluster(f"http://127.0.0.1:{router_port}", workers, str(model), processes)
    finally:
        for process in reversed(processes):
            process.stop()


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


def served(cluster: Cluster) -> list[int]:
    """Completions each replica has answered."""
    counts = []
    for url in cluster.workers:
        text = httpx.get(url + "/metrics", timeout=30).text
        counts.append(int(sum(float(m) for m in COMPLETIONS.findall(text))))
    return counts


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


def test_returning_sessions_go_to_the_replica_holding_their_prefix(cluster):
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
            after = served(cluster)
            deadline = time.monotonic() + 10
            while sum(after) == sum(before) and time.monotonic() < deadline:
                time.sleep(0.05)
                after = served(cluster)
            (routed,) = [r for r in range(len(after)) if after[r] > before[r]]
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
