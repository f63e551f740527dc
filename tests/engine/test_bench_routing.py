"""`resident bench routing` (issue 40): the traffic's shape, the hit-rate arithmetic, the
usage errors (a router that is not installed above all), and short real runs: two
replicas of a tiny random checkpoint behind sglang-router (round_robin against
cache_aware), and a run whose router dies at once. Every process a run starts is
recorded and must be gone afterwards; the fixture kills any survivor by its PID."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import sys

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.core.clients.http import SESSION_HEADERS as AGENT_SESSION_HEADERS
from engine.devtools.benchmarks import routing, routing_routers
from engine.devtools.benchmarks.routing_traffic import (
    SESSION_HEADERS,
    TrafficShape,
    approximate_tokens,
    best_hit_rate,
    make_traffic,
    over_baseline,
    percentile,
    summarize,
)

SHAPE = TrafficShape(
    repositories=3, sessions_per_repository=2, turns=3, repository_tokens=(200, 300),
    turn_tokens=40, seed=7,
)  # fmt: skip
ROUTING_KEY = re.compile(r"^repo-[0-9a-f]{24}$")  # as agent/core/clients/http.py repository_key


def bench(*args: str):
    return CliRunner().invoke(app, ["bench", "routing", *args])


def test_the_traffic_is_agent_shaped():
    traffic = make_traffic(SHAPE)
    sessions = traffic.sessions
    assert len(sessions) == 6 and traffic.requests == 18
    assert all(len(s.requests) == 3 for s in sessions)
    # Sessions start with repositories mixed, not one repository after another.
    assert len({s.repository for s in sessions[: SHAPE.repositories]}) > 1
    systems = {}
    for session in sessions:
        first = session.requests[0]
        assert [m["role"] for m in first] == ["system", "user"]
        systems.setdefault(session.repository, first[0]["content"])
        assert first[0]["content"] == systems[session.repository]  # the shared prefix
        low, high = SHAPE.repository_tokens
        assert approximate_tokens(first[0]["content"]) >= low
        for before, after in zip(session.requests, session.requests[1:], strict=False):
            assert after[: len(before)] == before  # each turn extends the last prompt
            assert [m["role"] for m in after[len(before) :]] == ["assistant", "user"]
        assert session.approx_tokens == sorted(session.approx_tokens)
        assert ROUTING_KEY.match(session.key)
        assert session.headers == {name: session.key for name in SESSION_HEADERS}
    assert len(set(systems.values())) == SHAPE.repositories
    keys = {s.repository: s.key for s in sessions}  # one key per repository, as the agent sends
    assert all(s.key == keys[s.repository] for s in sessions) and len(set(keys.values())) == len(
        keys
    )
    # The first user message is the session's own: no two sessions share more than the system.
    assert len({s.requests[0][1]["content"] for s in sessions}) == len(sessions)
    assert make_traffic(SHAPE).sessions == sessions  # seeded: every policy replays the same


def test_the_session_headers_are_the_ones_the_agent_sends():
    assert SESSION_HEADERS == AGENT_SESSION_HEADERS


def test_a_tokenizer_sizes_the_prompts_and_bounds_the_hit_rate():
    def tokenize(messages):  # one id per character: prefixes stay prefixes
        return [ord(c) for m in messages for c in f"<{m['role']}>{m['content']}"]

    traffic = make_traffic(SHAPE, approximate_tokens, tokenize)
    for session in traffic.sessions:
        assert session.approx_tokens == [len(ids) for ids in session.prompt_ids]
    best = traffic.best_hit_rate(16)
    assert 0.5 < best < 1
    assert make_traffic(SHAPE).best_hit_rate(16) is None  # nothing tokenized


def test_the_hit_rate_arithmetic():
    records = [
        {"prompt_tokens": 100, "cached_tokens": 0, "ttft_s": 0.4},
        {"prompt_tokens": 120, "cached_tokens": 96, "ttft_s": 0.1},
        {"prompt_tokens": 140, "cached_tokens": 112, "ttft_s": 0.2},
        {"prompt_tokens": 40, "cached_tokens": 32, "ttft_s": 0.3},
    ]
    figures = summarize(records)
    assert figures["requests"] == 4
    assert (figures["prompt_tokens"], figures["cached_tokens"]) == (400, 240)
    assert figures["prefill_tokens"] == 160
    assert figures["hit_rate"] == pytest.approx(0.6)
    assert figures["ttft_mean_s"] == pytest.approx(0.25)
    assert (figures["ttft_p50_s"], figures["ttft_p90_s"]) == (0.2, 0.4)
    assert summarize([])["hit_rate"] == 0.0 and summarize([])["ttft_p50_s"] is None
    assert percentile(range(1, 11), 90) == 9 and percentile([5.0], 50) == 5.0

    policies = {
        "round_robin": {"hit_rate": 0.4, "prefill_tokens": 600},
        "cache_aware": {"hit_rate": 0.6, "prefill_tokens": 400},
    }
    over_baseline(policies)
    assert policies["cache_aware"]["hit_rate_over_round_robin"] == pytest.approx(1.5)
    assert policies["cache_aware"]["prefill_tokens_over_round_robin"] == pytest.approx(2 / 3)
    assert policies["round_robin"]["hit_rate_over_round_robin"] == 1
    alone = {"manual": {"hit_rate": 0.5, "prefill_tokens": 5}}
    over_baseline(alone)
    assert alone["manual"]["hit_rate_over_round_robin"] is None


def test_the_best_hit_rate_counts_each_page_once():
    page = [1, 2, 3, 4]
    a = page + [5, 6, 7, 8] + [9]  # two full pages and a partial one
    b = page + [5, 6, 7, 8] + [10, 11, 12, 13]  # shares a's two pages
    c = [7, 7, 7, 7] + page  # the same page after a different one: not shared
    # b finds 8 tokens cached, whichever of a and b comes first; c finds none.
    assert best_hit_rate([a, b, c], 4) == pytest.approx(8 / 29)
    assert best_hit_rate([b, a, c], 4) == pytest.approx(8 / 29)
    assert best_hit_rate([], 4) == 0.0


@pytest.fixture
def no_routers(tmp_path, monkeypatch):
    """Neither router beside this Python nor on PATH."""
    monkeypatch.setattr(routing_routers, "environment_bin", lambda: tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.mark.parametrize("router,package", [("sglang", "sglang-router"), ("vllm", "vllm-router")])
def test_a_router_that_is_not_installed_is_a_usage_error(no_routers, router, package):
    result = bench("--router", router, "--model", "no-such-model")
    assert result.exit_code == 2, result.output
    assert f"pip install {package}" in result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback


@pytest.mark.parametrize(
    "args,message",
    [
        (["--router", "nginx"], "--router: unknown nginx"),
        (["--policies", "fastest"], "--policies: unknown fastest"),
        (["--router", "sglang", "--policies", "kv_aware"], "none of kv_aware"),
        (["--router", "sglang", "--prompt-form", "token-ids"], "takes no token-id prompts"),
        (["--repository-tokens", "many"], "LOW-HIGH"),
    ],
)
def test_other_usage_errors(args, message):
    result = bench(*args, "--model", "no-such-model")
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.fixture
def started(monkeypatch):
    """Every child a run starts; any still alive afterwards is killed by its PID (and the
    test fails: the run should have stopped it)."""
    children: list[routing.Running] = []

    class Recorded(routing.Running):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            children.append(self)

    monkeypatch.setattr(routing, "Running", Recorded)
    yield children
    survivors = [child for child in children if child.process.poll() is None]
    for child in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait()
    assert not survivors, [child.process.args for child in survivors]


TEST_SHAPE = TrafficShape(
    repositories=4, sessions_per_repository=2, turns=3, repository_tokens=(150, 250),
    turn_tokens=30, seed=40,
)  # fmt: skip


def test_two_replicas_behind_sglang_router(tiny_llama_dir, started):
    pytest.importorskip("sglang_router")
    result = routing.run_routing(
        str(tiny_llama_dir), {"sglang": ("round_robin", "cache_aware")}, shape=TEST_SHAPE
    )
    assert len(started) == 4  # two replicas, one router per policy
    assert all(child.process.poll() is not None for child in started)
    facts = result["replicas"]
    assert (
        facts["count"] == 2 and facts["capacity_tokens"] < result["traffic"]["working_set_tokens"]
    )
    measured = result["routers"]["sglang"]["policies"]
    for figures in measured.values():
        assert figures["requests"] == 24 and sum(figures["per_replica_requests"]) == 24
        assert figures["prefill_tokens"] == figures["prompt_tokens"] - figures["cached_tokens"]
        assert 0 < figures["ttft_p50_s"] <= figures["ttft_p90_s"]
        assert figures["hit_rate"] <= result["traffic"]["best_hit_rate"] + 0.02
    robin, aware = measured["round_robin"], measured["cache_aware"]
    assert robin["per_replica_requests"] == [12, 12]
    assert aware["hit_rate"] > robin["hit_rate"], (aware, robin)
    assert aware["hit_rate_over_round_robin"] > 1
    table = routing.format_table(result)
    assert "cache_aware" in table and "best possible hit rate" in table


def test_every_process_stops_when_the_router_dies(tiny_llama_dir, started, tmp_path, monkeypatch):
    dying = tmp_path / "sglang-router"
    dying.write_text("#!/bin/sh\necho 'no such flag' >&2\nexit 3\n")
    dying.chmod(dying.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(routing, "find_router", lambda name: dying)
    with pytest.raises(RuntimeError, match="the router exited: no such flag"):
        routing.run_routing(
            str(tiny_llama_dir), {"sglang": ("round_robin",)}, replicas=1, shape=TEST_SHAPE
        )
    assert [child.process.args[0] for child in started] == [sys.executable, str(dying)]
    assert all(child.process.poll() is not None for child in started)
