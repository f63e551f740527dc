"""What both sides of `resident bench families` share: the figures and their sizes, the
prompts, and servers timed from their start (the load figure) or asked for many
completions at once (llama-server's batch).

Prompts are token ids drawn at random from ids every family's test tokenizer
holds (the weights are random, so text would mean nothing), a new draw per
round, so nothing one run computed can serve another.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import httpx

from engine.devtools.benchmarks.long_decode import DEFAULT_CONTEXTS
from engine.devtools.benchmarks.long_decode import FIGURE as LONG_DECODE
from engine.devtools.benchmarks.long_decode import sizes as long_decode_sizes
from engine.devtools.benchmarks.measured_process import Running

# What a run measures unless told; long_decode (Resident alone, its prefills take minutes
# at 32k on a few cores) only when asked for.
DEFAULT_FIGURES = ("one_stream", "batch16", "prefill", "long_context", "load")
FIGURES = (*DEFAULT_FIGURES, LONG_DECODE)
FIGURES_WITHOUT_PEER = (LONG_DECODE,)
SIZES = {
    "one_stream": {"prompt": 512, "new": 128},
    "batch16": {"sequences": 16, "prompt": 512, "new": 128},
    "prefill": {"prompt": 2048},
    "long_context": {"prompt": 8192, "new": 64},
    "load": {"prompt": 16, "new": 1},
    LONG_DECODE: long_decode_sizes(DEFAULT_CONTEXTS),
}
_TOKEN_IDS = (10, 250)  # below every test tokenizer's size (and far below the models')
_HEALTH_DEADLINE_S = 1800.0
_HEALTH_POLL_S = 0.02  # the load figure's resolution
_REQUEST_TIMEOUT_S = 3600.0


def prompt_ids(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*_TOKEN_IDS) for _ in range(length)]


def wait_healthy(server: Running, url: str) -> str:
    """Poll `url`/health until the server answers 200; the model id it serves."""
    deadline = time.monotonic() + _HEALTH_DEADLINE_S
    with httpx.Client(base_url=url, timeout=10) as client:
        while True:
            if not server.alive():
                raise RuntimeError(f"the server exited: {server.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get("/health").status_code == 200:
                    return client.get("/v1/models").json()["data"][0]["id"]
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not become healthy: {server.log_tail()}")
            time.sleep(_HEALTH_POLL_S)


def completion(client: httpx.Client, body: dict) -> int:
    response = client.post("/v1/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text[:2000]}")
    return response.json()["usage"]["completion_tokens"]


def time_to_first_token(command: list[str], url: str, env: dict | None = None) -> dict:
    """The load figure of a server: `command` started in a fresh process until its first
    generated token (a short prompt, one token) has come back, and its peak RSS by then."""
    start = time.perf_counter()
    with Running(command, env) as server:
        model = wait_healthy(server, url)
        body = {
            "model": model,
            "prompt": prompt_ids(SIZES["load"]["prompt"], 0),
            "max_tokens": SIZES["load"]["new"],
            "temperature": 0,
        }
        with httpx.Client(base_url=url, timeout=_REQUEST_TIMEOUT_S) as client:
            completion(client, body)
        load_s = time.perf_counter() - start
        peak = server.stop()
    return {"load_s": load_s, "peak_rss_bytes": peak}


def concurrent_completions(
    url: str, model: str, prompts: list[list[int]], new: int, extra: dict
) -> float:
    """Seconds for `prompts` asked at once (each `new` tokens, EOS ignored), answered whole."""

    async def ask_all() -> list[int]:
        limits = httpx.Limits(max_connections=len(prompts) + 4)
        async with httpx.AsyncClient(
            base_url=url, timeout=_REQUEST_TIMEOUT_S, limits=limits
        ) as client:

            async def ask(prompt: list[int]) -> int:
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": new,
                    "temperature": 0,
                    "ignore_eos": True,
                    **extra,
                }
                response = await client.post("/v1/completions", json=body)
                if response.status_code != 200:
                    raise RuntimeError(f"{response.status_code}: {response.text[:2000]}")
                return response.json()["usage"]["completion_tokens"]

            return await asyncio.gather(*(ask(p) for p in prompts))

    start = time.perf_counter()
    made = asyncio.run(ask_all())
    elapsed = time.perf_counter() - start
    if any(tokens != new for tokens in made):
        raise RuntimeError(f"asked for {new} tokens per request, got {made}")
    return elapsed
