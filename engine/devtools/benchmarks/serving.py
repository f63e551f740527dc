"""Serving benchmarks over HTTP: prefix reuse (TTFT) and 32 concurrent clients.

Both start `resident serve`'s app in this process on a loopback port and talk
to it over real HTTP, so the numbers include the server, SSE and the async
engine, not only the model. Each reports ratios measured within one run,
since absolute numbers on a shared machine are noisy.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import platform
import statistics
import time
from contextlib import contextmanager

import httpx
import torch

from engine.config import default_setting
from engine.devtools.benchmarks.http_client import stream_chat
from engine.devtools.benchmarks.throughput import PROMPTS
from engine.model_files.store import DEFAULT_MODEL_NAME

DEFAULT_MODEL = DEFAULT_MODEL_NAME
DEFAULT_KV_DTYPE = default_setting("kv_cache_dtype")


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


@contextmanager
def local_server(model: str, **config):
    """The engine and app of `resident serve`, on a free loopback port."""
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.server.app import create_app
    from engine.server.background import BackgroundServer
    from engine.server.served_model import ServedModel

    engine = AsyncEngine.open(EngineConfig(model=model, **config))
    try:
        served = ServedModel.from_engine(engine, model)
        app = create_app(engine, served)
        with BackgroundServer(app) as server:
            server.engine = engine
            server.model_id = served.id  # what requests name: the model given, not the default
            yield server
    finally:
        engine.shutdown()


def source_text(tokenizer, num_tokens: int) -> str:
    """About `num_tokens` tokens of real Python source (a repository snapshot stands in)."""
    import json.decoder
    import json.encoder
    import textwrap

    text = ""
    for module in (json.decoder, json.encoder, textwrap, inspect):
        text += f"# file: {module.__name__}\n" + inspect.getsource(module)
        ids = tokenizer.encode(text)
        if len(ids) >= num_tokens:
            return tokenizer.decode(ids[:num_tokens])
    return text


def _chat(model: str, system: str, question: str, max_tokens: int, salt: str) -> dict:
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_salt": salt,
    }


def run_prefix(
    model: str = DEFAULT_MODEL, prefix_tokens: int = 6000, kv_cache_dtype: str = DEFAULT_KV_DTYPE
) -> dict:
    """TTFT of a request sharing a long prefix with an earlier one, against the same cold.

    Three requests: (salt A, question 1) fills the cache; (salt A, question 2)
    reuses the prefix; (salt B, question 2) is the same prompt on a cold cache
    (a salt shares nothing), so warm and cold differ only in the cache.
    """
    with local_server(model, kv_cache_dtype=kv_cache_dtype) as server:
        system = source_text(server.engine.tokenizer, prefix_tokens)
        name = server.model_id

        async def measure() -> dict:
            async with httpx.AsyncClient(base_url=server.url, timeout=1800) as client:
                # Warm-up on a short prompt: one-time costs are not a cold prefix's fault.
                await stream_chat(client, _chat(name, "Hi.", "Hello?", 2, "warmup"))
                fill = await stream_chat(client, _chat(name, system, "Summarise decoder.", 4, "A"))
                warm = await stream_chat(client, _chat(name, system, "What does dumps do?", 4, "A"))
                cold = await stream_chat(client, _chat(name, system, "What does dumps do?", 4, "B"))
                return {"fill": fill, "warm": warm, "cold": cold}

        runs = asyncio.run(measure())
    warm, cold = runs["warm"], runs["cold"]
    return {
        "benchmark": "prefix_reuse",
        "model": model,
        "kv_cache_dtype": kv_cache_dtype,
        "prompt_tokens": cold.usage["prompt_tokens"],
        "cached_tokens_warm": warm.usage["prompt_tokens_details"]["cached_tokens"],
        "cached_tokens_cold": cold.usage["prompt_tokens_details"]["cached_tokens"],
        "ttft_s": {name: round(t.ttft, 4) for name, t in runs.items()},
        "warm_over_cold": round(warm.ttft / cold.ttft, 4),
        "target_warm_over_cold": 0.1,
        "machine": machine(),
    }


def _transformers_one_by_one(model_dir: str, prompts: list[list[int]], max_tokens: int) -> dict:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    pad = hf.config.pad_token_id or 0

    def generate(ids: list[int]) -> int:
        with torch.inference_mode():
            out = hf.generate(
                input_ids=torch.tensor([ids]),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return out.shape[1] - len(ids)

    generate(prompts[0][:8])  # warm-up
    start = time.perf_counter()
    tokens = sum(generate(ids) for ids in prompts)
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 3), "tokens": tokens, "tok_s": round(tokens / seconds, 2)}


def run_concurrency(
    model: str = DEFAULT_MODEL,
    clients: int = 32,
    max_tokens: int = 16,
    kv_cache_dtype: str = DEFAULT_KV_DTYPE,
    with_transformers: bool = True,
) -> dict:
    """`clients` concurrent streaming chats against the server, and the same prompts
    through transformers one by one (EOS ignored on both sides, so equal token counts)."""
    questions = [f"{PROMPTS[i % len(PROMPTS)]} (#{i})" for i in range(clients)]
    with local_server(model, kv_cache_dtype=kv_cache_dtype) as server:
        tokenizer = server.engine.tokenizer
        model_dir = str(server.engine.engine.model_dir)

        def body(question: str) -> dict:
            return {
                "model": server.model_id,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }

        async def measure():
            limits = httpx.Limits(max_connections=clients + 4)
            async with httpx.AsyncClient(base_url=server.url, timeout=1800, limits=limits) as c:
                await stream_chat(c, body("warm-up"))
                start = time.perf_counter()
                timings = await asyncio.gather(*(stream_chat(c, body(q)) for q in questions))
                return timings, time.perf_counter() - start

        timings, seconds = asyncio.run(measure())
    tokens = sum(t.usage["completion_tokens"] for t in timings)
    ttfts = sorted(t.ttft for t in timings)
    # Per request: first to last token over the tokens between. Chunks can carry several
    # tokens (the server paces streams: engine.requests.pacing), so gaps between chunks
    # are not gaps between tokens.
    per_token = [
        (t.token_times[-1] - t.token_times[0]) / (t.usage["completion_tokens"] - 1)
        for t in timings
        if t.token_times and t.usage["completion_tokens"] > 1
    ]
    result = {
        "benchmark": "concurrent_clients",
        "model": model,
        "kv_cache_dtype": kv_cache_dtype,
        "clients": clients,
        "max_tokens": max_tokens,
        "server": {
            "seconds": round(seconds, 3),
            "tokens": tokens,
            "tok_s": round(tokens / seconds, 2),
            "ttft_median_s": round(statistics.median(ttfts), 3),
            "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 3),
            "time_per_output_token_median_s": (
                round(statistics.median(per_token), 4) if per_token else None
            ),
        },
        "machine": machine(),
    }
    if with_transformers:
        from engine.rendering import ChatRenderer

        # The prompts the server rendered for these chats, through the same renderer.
        renderer = ChatRenderer(tokenizer)
        ids = [renderer.render([{"role": "user", "content": q}]).token_ids for q in questions]
        base = _transformers_one_by_one(model_dir, ids, max_tokens)
        result["transformers_one_by_one"] = base
        result["server_speedup"] = round(result["server"]["tok_s"] / base["tok_s"], 2)
    return result
