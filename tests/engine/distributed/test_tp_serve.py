"""`resident serve --tp 2` end to end: the official openai client, a killed worker, stopping
by PID with no orphans, and two "nodes" meeting over TCP rendezvous on loopback."""

from __future__ import annotations

import os
import signal

import httpx
import openai

from tests.engine.distributed.helpers import (
    children,
    free_port,
    is_running,
    kill_all,
    patience,
    resident_command,
    running,
    spawned_workers,
    stop,
    wait_healthy,
    wait_until,
)

CHAT = [{"role": "user", "content": "Say something."}]


def _serve(model_dir, *flags: str) -> list[str]:
    return resident_command(
        "serve", "--model", str(model_dir), "--kv-memory", "0.01", "--max-num-seqs", "4", *flags
    )


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=patience(12)
    )


def test_serve_tp2_answers_openai_and_reports_a_killed_worker(tiny_llama_dir, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    with running(_serve(tiny_llama_dir, "--port", str(port), "--tp", "2"), log_path) as server:
        wait_healthy(server, url, log_path)
        started = children(server.pid)  # the worker and multiprocessing's resource tracker
        (worker,) = spawned_workers(server.pid)
        client = _client(url)
        reply = client.chat.completions.create(model="model", messages=CHAT, max_tokens=5)
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage.completion_tokens > 0
        stats = httpx.get(url + "/v1/engine/stats", timeout=patience(3)).json()
        assert stats["parallel"] == {"tp": 2, "ep": 1, "nnodes": 1, "ranks_alive": 2}
        assert "resident_ranks_alive 2.0" in httpx.get(url + "/metrics", timeout=patience(3)).text

        os.kill(worker, signal.SIGKILL)

        def unhealthy():
            response = httpx.get(url + "/health", timeout=patience(1))
            return response if response.status_code == 503 else None

        message = wait_until(unhealthy, patience(3), "/health to report the dead rank").json()
        assert "rank 1" in message["error"]["message"]
        assert "SIGKILL" in message["error"]["message"]
        try:
            client.chat.completions.create(model="model", messages=CHAT, max_tokens=5)
            raise AssertionError("a request to an engine with a dead rank was answered")
        except openai.APIStatusError as err:
            assert err.status_code == 503
            assert "rank 1" in str(err)
        metrics = wait_until(
            lambda: "resident_ranks_alive 1.0" in (m := httpx.get(url + "/metrics").text) and m,
            patience(3),
            "the worker to be counted dead",
        )
        assert "resident_tensor_parallel_size 2.0" in metrics
        assert stop(server) == 0, log_path.read_text()
    wait_until(lambda: not any(is_running(pid) for pid in started), patience(3), "no orphans")
    output = log_path.read_text()
    assert "tensor parallel 2 (expert parallel 1) over 1 node(s), 2 ranks alive" in output
    assert "prefix disk tier (--kv-disk) is off with --tp > 1" in output


def test_workers_die_with_a_killed_server(tiny_llama_dir, tmp_path):
    port = free_port()
    log_path = tmp_path / "serve.log"
    with running(_serve(tiny_llama_dir, "--port", str(port), "--tp", "2"), log_path) as server:
        wait_healthy(server, f"http://127.0.0.1:{port}", log_path)
        started = children(server.pid)
        try:
            assert spawned_workers(server.pid)
            server.kill()  # no clean-up runs in rank 0
            server.wait(timeout=patience(3))
            wait_until(lambda: not any(is_running(p) for p in started), patience(3), "no orphans")
        finally:
            kill_all(started)  # orphans, if the test failed: no longer the server's children


def test_two_nodes_meet_on_loopback_and_answer(tiny_llama_dir, tmp_path):
    master = free_port()
    port = free_port(master)
    url = f"http://127.0.0.1:{port}"
    both = ("--tp", "2", "--nnodes", "2", "--master-port", str(master))
    node1_log, node0_log = tmp_path / "node1.log", tmp_path / "node0.log"
    with (
        running(_serve(tiny_llama_dir, *both, "--node-rank", "1"), node1_log) as node1,
        running(
            _serve(tiny_llama_dir, *both, "--node-rank", "0", "--port", str(port)), node0_log
        ) as node0,
    ):
        wait_healthy(node0, url, node0_log)
        started = children(node1.pid) + children(node0.pid)
        assert len(spawned_workers(node1.pid)) == 1 and not spawned_workers(node0.pid)
        reply = _client(url).completions.create(model="model", prompt="def", max_tokens=4)
        assert reply.usage.completion_tokens > 0
        stats = httpx.get(url + "/v1/engine/stats", timeout=patience(3)).json()
        assert stats["parallel"] == {"tp": 2, "ep": 1, "nnodes": 2, "ranks_alive": 2}
        assert stop(node0) == 0, node0_log.read_text()
        # Rank 0's shutdown message stops node 1's worker; node 1 then exits by itself.
        assert node1.wait(timeout=patience(6)) == 0, node1_log.read_text()
    wait_until(lambda: not any(is_running(pid) for pid in started), patience(3), "no orphans")
    assert "node 1 of 2: ranks 1..1 started" in node1_log.read_text()


def test_parallel_options_are_checked_before_anything_loads():
    from typer.testing import CliRunner

    from engine.cli import engine_app

    for flags, words in (
        (["--tp", "2", "--nnodes", "2"], "--master-port is required with --nnodes > 1"),
        (["--tp", "3", "--nnodes", "2", "--master-port", "29511"], "does not split evenly"),
        (["--tp", "2", "--node-rank", "1"], "--node-rank must be 0..0"),
    ):
        result = CliRunner().invoke(engine_app, ["serve", "--model", "/nonexistent", *flags])
        assert result.exit_code == 2, result.output
        assert words in result.output


def test_engine_config_checks_the_layout():
    import pytest
    from pydantic import ValidationError

    from engine.config import EngineConfig

    assert EngineConfig(model="m", tensor_parallel_size=4, nnodes=2, master_port=1).local_ranks == 2
    with pytest.raises(ValidationError, match="master_port is required"):
        EngineConfig(model="m", tensor_parallel_size=2, nnodes=2)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        EngineConfig(model="m", tensor_parallel_size=0)
