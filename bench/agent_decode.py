"""Decode speed through the agent's local engine against the library, same prompts.

The agent's client (agent/core/clients/local.py, as the TUI and `resident run`
start it: prompt-lookup speculation, the disk tier, a tool-call grammar on
every request) streams chats rendered by the engine's renderer; the library
runs `LLM` with the same engine settings on the same rendered prompts. Both
decode greedily with at most `--max-tokens` tokens and stop at EOS, so both
make the same tokens; tokens per second is completion tokens over wall time,
one request alone and `--concurrency` at once, best of `--repeats` after a
warm-up. The library runs first: the agent's engine leaves this thread on one
OpenMP thread (engine/host/threads.py).

    python bench/agent_decode.py [--model NAME] [--max-tokens 128] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from agent.core.clients import ChatRequest
from agent.core.clients.base import Completion
from agent.core.clients.local import LocalClient
from engine import LLM, SamplingParams
from engine.devtools.benchmarks.serving_paths import machine
from engine.devtools.benchmarks.throughput import PROMPTS
from engine.rendering import ChatRenderer

AGENT_ENGINE = {"speculative": "prompt_lookup"}  # what start_engine adds to decode


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{PROMPTS[i % len(PROMPTS)]} Answer at length. (#{i})"}]


def _best(run, repeats: int) -> tuple[float, int]:
    run()
    best, tokens = 0.0, 0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = run()
        best = max(best, tokens / (time.perf_counter() - start))
    return round(best, 2), tokens


def _figures(single: tuple[float, int], concurrent: tuple[float, int]) -> dict:
    return {
        "single_tok_s": single[0],
        "concurrent_tok_s": concurrent[0],
        "tokens": {"single": single[1], "concurrent": concurrent[1]},
    }


def library(model: str, n: int, max_tokens: int, repeats: int) -> dict:
    with LLM(model, **AGENT_ENGINE) as llm:
        renderer = ChatRenderer(llm.tokenizer)
        prompts = [renderer.render(_messages(i)).token_ids for i in range(n)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0)

        def generate(batch) -> int:
            return sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params))

        return _figures(
            _best(lambda: generate(prompts[:1]), repeats), _best(lambda: generate(prompts), repeats)
        )


def agent(model: str, n: int, max_tokens: int, repeats: int) -> dict:
    client = LocalClient.start(model)

    async def one(i: int) -> int:
        tokens = 0
        async for item in client.stream(ChatRequest(_messages(i), max_tokens=max_tokens)):
            if isinstance(item, Completion):
                tokens = item.usage.completion_tokens
        return tokens

    async def figures() -> dict:
        async def best(make) -> tuple[float, int]:
            await make()
            top, tokens = 0.0, 0
            for _ in range(repeats):
                start = time.perf_counter()
                tokens = await make()
                top = max(top, tokens / (time.perf_counter() - start))
            return round(top, 2), tokens

        async def concurrent() -> int:
            return sum(await asyncio.gather(*(one(i) for i in range(n))))

        result = _figures(await best(lambda: one(0)), await best(concurrent))
        await client.aclose()
        return result

    return asyncio.run(figures())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    paths = {
        "library": library(args.model, args.concurrency, args.max_tokens, args.repeats),
        "agent_local_engine": agent(args.model, args.concurrency, args.max_tokens, args.repeats),
    }
    ratio = {
        figure: round(
            paths["agent_local_engine"][f"{figure}_tok_s"] / paths["library"][f"{figure}_tok_s"], 3
        )
        for figure in ("single", "concurrent")
    }
    print(
        json.dumps(
            {
                "benchmark": "agent_decode",
                "model": args.model,
                "max_tokens": args.max_tokens,
                "concurrency": args.concurrency,
                "paths": paths,
                "agent_over_library": ratio,
                "machine": machine(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
