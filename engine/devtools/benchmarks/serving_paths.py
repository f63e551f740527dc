"""`resident bench serving`: decode speed on every path a user touches, in one run.

The same prompts and token counts (EOS ignored) through:
- `library`: `LLM(model).generate`, on this thread (requests at once: one batch);
- `async_engine`: `AsyncEngine`, stepped on its own thread and consumed by an
  asyncio loop on this one, the shape of the agent's local engine (TUI and
  headless) and of the server without HTTP;
- `http`: `resident serve` started as its own process on a free loopback port,
  with defaults, and asked over HTTP as a client would (streaming
  `/v1/completions`);
- `http_whole`: the same server answering each request whole, not streamed,
  so the client does nothing per token: the server's own cost;
- `peer` (given `--peer URL`): any OpenAI-compatible server (llama.cpp's
  `llama-server`, vLLM, SGLang) on the same model, asked the same way.

Each path gives one stream (one request of `max_tokens`) and `concurrency`
requests at once: completion tokens over wall time, the best of `repeats`
rounds after an untimed warm-up. The servers stay up the whole run and the
rounds interleave the paths (library, async engine, server, peer), so a
machine that drifts slows all of them alike and the ratios hold.
The two in-process engines take turns too, each handing its OpenMP pool back
after its turn: two teams in one process would slow each other
(engine.host.threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import torch

from engine.devtools.benchmarks.served import (
    served,
    served_model_id,
    stream_completion,
    whole_completion,
)
from engine.devtools.benchmarks.throughput import PROMPTS
from engine.host.threads import release_pool, usable_cores

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine

PATHS = ("library", "async_engine", "http", "http_whole")
TARGET_WITHIN = 0.10  # library, async engine and HTTP decode within 10% of each other
FIGURES = ("single", "concurrent")


@dataclass
class Path:
    name: str
    alone: Callable[[str], Awaitable[int]]  # one request -> completion tokens
    together: Callable[[list[str]], Awaitable[int]]  # requests at once -> tokens
    # An in-process engine hands its OpenMP pool back after its turn, so the other
    # one's team is the only one while it runs (engine.host.threads).
    leave: Callable[[], Awaitable[None]] | None = None


def _gathered(alone: Callable[[str], Awaitable[int]]) -> Callable[[list[str]], Awaitable[int]]:
    async def together(prompts: list[str]) -> int:
        return sum(await asyncio.gather(*(alone(p) for p in prompts)))

    return together


def _library_path(llm, max_tokens: int, threads: int) -> Path:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def generate(prompts: list[str]) -> int:  # a library user batches in one call
        torch.set_num_threads(threads)  # as the user had it (an AsyncEngine quiets this thread)
        return sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, params))

    async def leave() -> None:
        release_pool()

    return Path("library", lambda prompt: generate([prompt]), generate, leave)


def _async_path(engine: AsyncEngine, max_tokens: int) -> Path:
    from engine.requests.params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ids = iter(range(10**9))

    async def alone(prompt: str) -> int:
        last = None
        async for output in engine.generate(prompt, params, f"bench-{next(ids)}"):
            last = output
        return len(last.outputs[0].token_ids)

    async def leave() -> None:
        await engine.call(release_pool)

    return Path("async_engine", alone, _gathered(alone), leave)


def _http_path(
    name: str, client: httpx.AsyncClient, model: str, max_tokens: int, stream: bool = True
) -> Path:
    request = stream_completion if stream else whole_completion

    async def alone(prompt: str) -> int:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        return await request(client, body)

    return Path(name, alone, _gathered(alone))


async def _rounds(paths: list[Path], prompts: list[str], repeats: int, record: dict) -> None:
    """Warm every path up, then `repeats` rounds of each figure over the paths in turn;
    `record[name]` keeps each figure's best rate and the tokens a run made."""
    for path in paths:
        await path.alone(prompts[0])
        await path.together(prompts)
        if path.leave is not None:
            await path.leave()
    for _ in range(repeats):
        for figure in FIGURES:
            for path in paths:
                start = time.perf_counter()
                if figure == "single":
                    tokens = await path.alone(prompts[0])
                else:
                    tokens = await path.together(prompts)
                rate = tokens / (time.perf_counter() - start)
                if path.leave is not None:
                    await path.leave()
                entry = record.setdefault(path.name, {"tokens": {}})
                entry[f"{figure}_tok_s"] = round(max(rate, entry.get(f"{figure}_tok_s", 0.0)), 2)
                entry["tokens"][figure] = tokens


async def _measure_all(
    model: str,
    prompts: list[str],
    max_tokens: int,
    repeats: int,
    peer: str | None,
    peer_model: str | None,
    paths: tuple[str, ...],
) -> dict:
    from engine import LLM
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.kv.calibration import calibrate_without_fixed_scales

    record: dict = {}
    # A new connection per request: some servers (llama-server) close a streamed
    # response's connection, and a pooled one would fail on reuse; the same for all.
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=0)
    with contextlib.ExitStack() as stack:
        servers = []
        if {"http", "http_whole"} & set(paths):
            url = stack.enter_context(served(model))
            servers.append(("http", url, served_model_id(url, model)))
        if peer:
            url = peer.rstrip("/")
            servers.append(("peer", url, peer_model or served_model_id(url, model)))
        clients = [
            httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) for _, url, _ in servers
        ]
        try:
            external = []
            for (name, _, served_as), client in zip(servers, clients, strict=True):
                if name == "peer" or "http" in paths:
                    external.append(_http_path(name, client, served_as, max_tokens))
                if name == "http" and "http_whole" in paths:
                    whole = _http_path("http_whole", client, served_as, max_tokens, stream=False)
                    external.append(whole)
            in_process: list[Path] = []
            with contextlib.ExitStack() as engines:
                if "library" in paths:
                    llm = engines.enter_context(LLM(model))
                    calibrate_without_fixed_scales(llm)  # as `resident serve` does
                    threads = torch.get_num_threads()
                    in_process.append(_library_path(llm, max_tokens, threads))
                if "async_engine" in paths:
                    engine = AsyncEngine.open(EngineConfig(model=model))
                    engines.callback(engine.shutdown)
                    in_process.append(_async_path(engine, max_tokens))
                await _rounds([*in_process, *external], prompts, repeats, record)
        finally:
            for client in clients:
                await client.aclose()
    return record


def _ratio(a: dict, b: dict) -> dict:
    return {f: round(a[f"{f}_tok_s"] / b[f"{f}_tok_s"], 3) for f in FIGURES if b[f"{f}_tok_s"]}


def run_serving(
    model: str,
    max_tokens: int = 128,
    concurrency: int = 16,
    repeats: int = 3,
    peer: str | None = None,
    peer_model: str | None = None,
    paths: tuple[str, ...] = PATHS,
) -> dict:
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} (#{i})" for i in range(concurrency)]
    runs = asyncio.run(_measure_all(model, prompts, max_tokens, repeats, peer, peer_model, paths))
    ratios = {}
    for base in ("library", "peer"):
        for name in ("http", "http_whole", "async_engine", "library"):
            if name != base and name in runs and base in runs:
                ratios[f"{name}_over_{base}"] = _ratio(runs[name], runs[base])
    return {
        "benchmark": "serving",
        "model": model,
        "max_tokens": max_tokens,
        "concurrency": concurrency,
        "repeats": repeats,
        "paths": runs,
        "ratios": ratios,
        "target_within": TARGET_WITHIN,
        "machine": machine(),
    }


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
        f"best of {result['repeats']} interleaved rounds",
        f"{'path':<14}{'1 stream tok/s':>16}{str(result['concurrency']) + ' at once tok/s':>20}",
    ]
    for name, run in result["paths"].items():
        lines.append(f"{name:<14}{run['single_tok_s']:>16.1f}{run['concurrent_tok_s']:>20.1f}")
    for name, ratio in result["ratios"].items():
        figures = ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items())
        lines.append(f"{name}: {figures}")
    return "\n".join(lines)
