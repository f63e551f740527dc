"""First-turn time to first token with the resident prefix restored from disk vs cold; JSON.

Two scenarios on one model (default smollm2-135m-instruct, FP8 KV), each with a
repository-snapshot-sized resident prefix (source files of this repository
until ~5k tokens):

- agent: two LocalClient sessions one after the other (the agent's local
  engine); the second restores the prefix the first saved at its end. The
  time is from the request to its first token, restore included.
- serve: a server engine (AsyncEngine.open, as `resident serve`) answers, saves
  on stop; a restarted one restores on start (timed apart) and answers.

The disk tier lives in a temporary folder, so the first of each pair is cold.
Usage: python bench/resident_restore.py [model] [target_tokens]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def snapshot_text(tokenizer, target: int) -> str:
    """Source files of this repository, whole, until about `target` tokens."""
    parts, count = [], 0
    for path in sorted((ROOT / "engine" / "kv").glob("*.py")) + sorted(
        (ROOT / "engine").glob("*.py")
    ):
        text = f"## {path.relative_to(ROOT)}\n{path.read_text()}\n"
        n = len(tokenizer.encode(text))
        if count + n > target:
            continue
        parts.append(text)
        count += n
    return "".join(parts)


async def agent_turn(model: str, snapshot: str) -> dict:
    from agent.core.clients import ChatRequest, Completion
    from agent.core.clients.local import LocalClient

    client = LocalClient.start(model)
    system = {"role": "system", "content": "You are a coding agent. The repository:\n" + snapshot}
    request = ChatRequest(
        [system, {"role": "user", "content": "Which file defines the page allocator?"}],
        max_tokens=1,
        pinned_messages=1,
    )
    start = time.perf_counter()
    first = None
    usage = None
    async for item in client.stream(request):
        if first is None:
            first = time.perf_counter() - start
        if isinstance(item, Completion):
            usage = item.usage
    ttft = first if first is not None else time.perf_counter() - start
    await client.aclose()
    return {
        "ttft_s": round(ttft, 3),
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
    }


def serve_turn(model: str, token_ids: list[int]) -> dict:
    from engine.requests.params import SamplingParams
    from engine.server.launch import ServeOptions, build_engine, restore_prefixes, save_prefixes

    engine = build_engine(ServeOptions(model=model))
    try:
        start = time.perf_counter()
        restore_prefixes(engine)
        restore_s = time.perf_counter() - start

        async def one():
            start = time.perf_counter()
            params = SamplingParams(max_tokens=1, temperature=0)
            async for output in engine.generate(token_ids, params, "bench"):
                return time.perf_counter() - start, output.num_cached_tokens

        ttft, cached = asyncio.run(one())
        save_prefixes(engine)
    finally:
        engine.shutdown()
    return {"ttft_s": round(ttft, 3), "restore_on_start_s": round(restore_s, 3), "cached": cached}


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
    target = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    os.environ["RESIDENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="resident-bench-kv-")
    from engine.model_files.store import resolve_model
    from engine.tokenizers.loading import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(model))
    snapshot = snapshot_text(tokenizer, target)
    cold = asyncio.run(agent_turn(model, snapshot))
    warm = asyncio.run(agent_turn(model, snapshot))
    prompt = tokenizer.encode("The repository:\n" + snapshot + "\nWhich file defines pages?")
    serve_cold = serve_turn(model, prompt)
    serve_warm = serve_turn(model, prompt)
    print(
        json.dumps(
            {
                "model": model,
                "threads": os.cpu_count(),
                "agent": {
                    "cold": cold,
                    "restored": warm,
                    "ratio": round(warm["ttft_s"] / cold["ttft_s"], 3),
                },
                "serve": {
                    "prompt_tokens": len(prompt),
                    "cold": serve_cold,
                    "restarted": serve_warm,
                    "ratio": round(serve_warm["ttft_s"] / serve_cold["ttft_s"], 3),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
