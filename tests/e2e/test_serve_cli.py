"""`resident serve`: usage errors exit 2 before loading anything; a real start logs the KV cache."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from agent.cli import app
from engine.server.launch import ServeOptions, check_options, describe_kv, is_loopback
from tests.engine.checkpoints import tiny_llama

runner = CliRunner()


def test_non_loopback_without_key_is_refused(monkeypatch):
    monkeypatch.delenv("RESIDENT_API_KEY", raising=False)
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--model", "/nonexistent"])
    assert result.exit_code == 2
    assert "without an API key" in result.output and "Traceback" not in result.output


def test_key_from_the_environment_allows_a_public_bind(monkeypatch):
    monkeypatch.setenv("RESIDENT_API_KEY", "k1")
    options = check_options(ServeOptions(model="m", host="0.0.0.0"))
    assert options.api_key == "k1"


def test_unknown_values_exit_2():
    for flags, words in (
        (["--kv-rotation", "sideways"], "--kv-rotation must be one of"),
        (["--kv-scales", "/nonexistent/scales.json"], "no such file"),
        (["--kv-cache-dtype", "fp16"], "--kv-cache-dtype must be one of"),
        (["--dtype", "int8"], "--dtype must be one of"),
    ):
        result = runner.invoke(app, ["serve", "--model", "/nonexistent", *flags])
        assert result.exit_code == 2, result.output
        assert words in result.output


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert is_loopback("127.0.0.2")
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com"):
        assert not is_loopback(host)


def test_startup_description_names_dtype_capacity_and_scales():
    line = describe_kv(
        {
            "kv_cache_dtype": "fp8_e4m3",
            "capacity_tokens": 1024,
            "kv_bytes_per_token": 128,
            "max_context_tokens": 512,
            "kv_scales": {"source": "checkpoint", "k": [0.5, [0.25, 2.0]], "v": [1.0]},
        }
    )
    assert "fp8_e4m3" in line and "capacity 1024 tokens" in line
    assert "checkpoint" in line and "k 0.25..2" in line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_resident_serve_starts_answers_and_stops(tmp_path):
    model_dir = tiny_llama(tmp_path / "tiny-served")
    port = _free_port()
    log_path = tmp_path / "serve.log"
    command = [
        str(Path(sys.executable).parent / "resident"),
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--api-key",
        "secret",
        "--kv-memory",
        "0.01",
        "--max-num-seqs",
        "4",
    ]
    # A cache of its own: this start is a first one, which calibrates the FP8 KV scales.
    env = {**os.environ, "RESIDENT_API_KEY": "", "RESIDENT_CACHE_DIR": str(tmp_path / "cache")}
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.25)
        auth = {"Authorization": "Bearer secret"}
        assert httpx.get(url + "/v1/models", timeout=60).status_code == 401
        models = httpx.get(url + "/v1/models", headers=auth, timeout=60).json()
        assert models["data"][0]["id"] == str(model_dir)
        reply = httpx.post(
            url + "/v1/completions",
            json={"model": "tiny-served", "prompt": "def", "max_tokens": 2},
            headers=auth,
            timeout=120,  # the first step may compile the CPU kernels
        )
        assert reply.status_code == 200, reply.text
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # never leave it running
            process.kill()
            process.wait(timeout=30)
    output = log_path.read_text()
    assert "KV cache: fp8_e4m3, capacity" in output and "scales from" in output
    assert "scales from a built-in sample at start-up" in output  # before any request
    assert "API key required" in output
    assert "calibrating on a built-in sample" in output  # said before it takes its time


def test_a_taken_port_is_a_usage_error_before_the_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # No such model: had the weights been loaded first, this would fail differently.
        command = [
            str(Path(sys.executable).parent / "resident"),
            "serve",
            "--model",
            str(tmp_path / "no-model-here"),
            "--port",
            str(port),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "in use" in done.stderr
    assert "Traceback" not in done.stderr
