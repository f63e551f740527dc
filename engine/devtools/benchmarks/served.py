"""A server to measure and a client that measures it: `resident serve` in its own process,
and streaming `/v1/completions` requests that cost the client as little as they can.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

from engine.distributed.launch import free_port


@contextlib.contextmanager
def served(model: str, extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """`resident serve --model MODEL` in its own process on a free loopback port."""
    port = free_port()
    command = [sys.executable, "-m", "engine", "serve", "--model", model, "--port", str(port)]
    log = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would stall the server
    process = subprocess.Popen(
        [*command, *extra_args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"resident serve exited: {tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("resident serve did not become healthy in 600 s")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def served_model_id(url: str, fallback: str) -> str:
    try:
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        return models[0]["id"] if models else fallback
    except (httpx.HTTPError, KeyError, ValueError, IndexError):
        return fallback


async def stream_completion(client: httpx.AsyncClient, body: dict) -> int:
    """Completion tokens of one streaming `/v1/completions` request.

    The client shares the machine with the server it measures, so it does as little
    as it can per event: it reads raw bytes, counts the events that carry text and
    parses only the last one (the usage chunk). The same for every server."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events, tail, final = 0, b"", None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread()).decode()}")
        async for data in response.aiter_raw():
            complete, _, tail = (tail + data).rpartition(b"\n\n")
            if not complete:
                continue
            events += complete.count(b'"text":"') - complete.count(b'"text":""')
            for event in complete.split(b"\n\n"):
                if b'"usage":{' in event or b'"error":' in event:
                    final = event
    usage = None
    if final is not None:
        chunk = json.loads(final[final.index(b"{") :])
        if "error" in chunk:
            raise RuntimeError(chunk["error"].get("message", chunk["error"]))
        usage = chunk.get("usage")
    # A server that reports no usage in its stream: one event per token, as they send.
    return usage["completion_tokens"] if usage else events


async def whole_completion(client: httpx.AsyncClient, body: dict) -> int:
    """Completion tokens of one `/v1/completions` request answered whole (not streamed):
    the client does nothing per token, so this measures the server alone."""
    response = await client.post("/v1/completions", json={**body, "stream": False})
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text}")
    return response.json()["usage"]["completion_tokens"]
