"""`resident bench serving`: decode speed on every path a user touches, in one run.

The same prompts and token counts (EOS ignored) through:
- `library`: `LLM(model).generate`, on this thread;
- `async_engine`: `AsyncEngine`, stepped on its own thread and consumed by an
  asyncio loop on this one, the shape of the agent's local engine (TUI and
  headless) and of the server without HTTP;
- `http`: `resident serve` started as its own process on a free loopback port,
  with defaults, and asked over HTTP as a client would (streaming
  `/v1/completions`);
- `peer` (given `--peer URL`): any OpenAI-compatible server (llama.cpp's
  `llama-server`, vLLM, SGLang) on the same model, asked the same way.

Each path gives one stream (one request of `max_tokens`) and `concurrency`
requests at once: completion tokens over wall time, best of `repeats` after an
untimed warm-up. Ratios are taken within the run, since absolute numbers on a
shared machine are noisy. The paths run one after another: two engines'
OpenMP teams in one process would slow each other (engine.host.threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import torch

from engine.benchmarks.throughput import PROMPTS
from engine.distributed.launch import free_port
from engine.host.threads import usable_cores

PATHS = ("library", "async_engine", "http")
TARGET_WITHIN = 0.10  # library, async engine and HTTP decode within 10% of each other


OneRequest = Callable[[str], Awaitable[int]]


def _prompts(concurrency: int) -> list[str]:
    return [f"{PROMPTS[i % len(PROMPTS)]} (#{i})" for i in range(concurrency)]


async def _best(measure: Callable[[], Awaitable[int]], repeats: int) -> float:
    """Tokens per second of `measure()` (which returns tokens made): best of `repeats`."""
    await measure()  # warm-up, untimed
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = await measure()
        best = max(best, tokens / (time.perf_counter() - start))
    return round(best, 2)


async def _figures(one: OneRequest, prompts: list[str], repeats: int) -> dict:
    """One stream, then every prompt at once, through `one(prompt) -> tokens`."""

    async def concurrent() -> int:
        return sum(await asyncio.gather(*(one(p) for p in prompts)))

    return {
        "single_tok_s": await _best(lambda: one(prompts[0]), repeats),
        "concurrent_tok_s": await _best(concurrent, repeats),
    }


# ----- the paths -----------------------------------------------------------------
def _library(model: str, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    from engine import LLM, SamplingParams
    from engine.calibration import calibrate_without_fixed_scales

    with LLM(model) as llm:
        calibrate_without_fixed_scales(llm.engine)  # as `resident serve` does at start
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

        async def generate(batch: list[str]) -> int:  # a library user batches in one call
            return sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params))

        async def figures() -> dict:
            return {
                "single_tok_s": await _best(lambda: generate(prompts[:1]), repeats),
                "concurrent_tok_s": await _best(lambda: generate(prompts), repeats),
            }

        return asyncio.run(figures())


def _async_engine(model: str, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

    engine = AsyncEngine.open(EngineConfig(model=model))
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ids = iter(range(10**9))

    async def one(prompt: str) -> int:
        last = None
        async for output in engine.generate(prompt, params, f"bench-{next(ids)}"):
            last = output
        return len(last.outputs[0].token_ids)

    try:
        return asyncio.run(_figures(one, prompts, repeats))
    finally:
        engine.shutdown()


async def _stream_completion(client: httpx.AsyncClient, body: dict) -> int:
    """Completion tokens of one streaming `/v1/completions` request."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks, usage = 0, None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread()).decode()}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("message", chunk["error"]))
            usage = chunk.get("usage") or usage
            chunks += sum(1 for c in chunk.get("choices", []) if c.get("text"))
    # A server that reports no usage in its stream: one chunk per token, as they send.
    return usage["completion_tokens"] if usage else chunks


def _over_http(url: str, model: str, prompts: list[str], max_tokens: int, repeats: int) -> dict:
    async def figures() -> dict:
        # A new connection per request: some servers (llama-server) close a streamed
        # response's connection, and a pooled one would fail on reuse; the same for all.
        limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:

            async def one(prompt: str) -> int:
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                return await _stream_completion(client, body)

            return await _figures(one, prompts, repeats)

    return asyncio.run(figures())


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


def _served_model_id(url: str, fallback: str) -> str:
    try:
        models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        return models[0]["id"] if models else fallback
    except (httpx.HTTPError, KeyError, ValueError, IndexError):
        return fallback


def _ratio(a: dict, b: dict) -> dict:
    return {
        figure: round(a[f"{figure}_tok_s"] / b[f"{figure}_tok_s"], 3)
        for figure in ("single", "concurrent")
        if b.get(f"{figure}_tok_s")
    }


def run_serving(
    model: str,
    max_tokens: int = 128,
    concurrency: int = 16,
    repeats: int = 3,
    peer: str | None = None,
    peer_model: str | None = None,
    paths: tuple[str, ...] = PATHS,
) -> dict:
    prompts = _prompts(concurrency)
    result: dict = {
        "benchmark": "serving",
        "model": model,
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "repeats": repeats,
        "paths": {},
        "machine": machine(),
    }
    runs = result["paths"]
    # HTTP and the peer first: this process only waits on sockets while they decode.
    if "http" in paths:
        with served(model) as url:
            name = _served_model_id(url, model)
            runs["http"] = _over_http(url, name, prompts, max_tokens, repeats)
    if peer:
        name = peer_model or _served_model_id(peer, model)
        runs["peer"] = _over_http(peer.rstrip("/"), name, prompts, max_tokens, repeats)
    if "library" in paths:
        runs["library"] = _library(model, prompts, max_tokens, repeats)
    if "async_engine" in paths:  # last: it leaves this thread on one OpenMP thread
        runs["async_engine"] = _async_engine(model, prompts, max_tokens, repeats)
    ratios = {}
    if "library" in runs:
        for name in ("http", "async_engine"):
            if name in runs:
                ratios[f"{name}_over_library"] = _ratio(runs[name], runs["library"])
    if "peer" in runs:
        for name in ("http", "library"):
            if name in runs:
                ratios[f"{name}_over_peer"] = _ratio(runs[name], runs["peer"])
    result["ratios"] = ratios
    result["target_within"] = TARGET_WITHIN
    return result


def machine() -> dict:
    from engine.host.cpu_features import describe_cpu

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        **describe_cpu(),
    }


def format_table(result: dict) -> str:
    lines = [
        f"{result['model']}: {result['max_tokens']} tokens per request, EOS ignored; "
        f"best of {result['repeats']}",
        f"{'path':<14}{'1 stream tok/s':>16}{str(result['concurrency']) + ' at once tok/s':>20}",
    ]
    for name, run in result["paths"].items():
        lines.append(f"{name:<14}{run['single_tok_s']:>16.1f}{run['concurrent_tok_s']:>20.1f}")
    for name, ratio in result["ratios"].items():
        figures = ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items())
        lines.append(f"{name}: {figures}")
    return "\n".join(lines)
