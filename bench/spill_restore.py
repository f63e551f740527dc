"""A pinned prefix that gave way: brought back from the host tier vs prefilled; JSON.

One engine (default smollm2-135m-instruct, FP8 KV) with the host tier turned
on explicitly (on a CPU pool it is off by default). A ~4k-token prefix of this
repository's source is prefilled and pinned; then its pages are made to give
way with the call the scheduler makes under pressure
(`prefix_cache.evict(n, pinned=True)`, which spills them to the host tier),
rather than by a second long prompt, which would double the run time without
changing what is measured. The same prompt is then asked again, and its time
to first token (restore of the spilled pages + prefill of the tail) is set
against a cold prefill of the same prompt (measured twice: the first one also
calibrates the FP8 scales) and against the same prompt while the pages were
still in the pool (the floor: only the tail is prefilled). Greedy tokens are
compared too.

Timings on a shared machine are noisy; the ratio is the figure to read.
Usage: python bench/spill_restore.py [model] [prefix_tokens]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL = "\n# Question: which of these files defines the page allocator?\n"


def source_ids(tokenizer, count: int) -> list[int]:
    """`count` tokens of this repository's engine source."""
    ids: list[int] = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        ids += tokenizer.encode(f"## {path.relative_to(ROOT)}\n{path.read_text()}\n")
        if len(ids) >= count:
            return ids[:count]
    raise SystemExit(f"the engine's source has fewer than {count} tokens")


def timed_request(engine, ids: list[int], params) -> dict:
    """Time to first token and the request's outputs, stepping the engine directly."""
    start = time.perf_counter()
    seq = engine.add_request(ids, params)
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None and seq.output_token_ids:
            first = time.perf_counter() - start
    return {
        "ttft_s": round(first, 3),
        "cached_tokens": seq.num_cached_tokens,
        "tokens": list(seq.output_token_ids),
    }


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
    prefix_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    from engine import LLM, SamplingParams

    llm = LLM(model, kv_host_gib=1.0)
    engine = llm.engine
    cache, spill = engine.prefix_cache, engine.prefix_spill
    prefix = source_ids(engine.tokenizer, prefix_tokens)
    prompt = prefix + engine.tokenizer.encode(TAIL)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    cold_first = timed_request(engine, prompt, params)  # also calibrates the FP8 scales
    handle = engine.pin_prefix(prefix)
    resident = timed_request(engine, prompt, params)  # pages still in the pool: the floor
    start = time.perf_counter()
    cache.evict(cache.num_pages, pinned=True)
    spill_s = time.perf_counter() - start
    spilled = engine.stats()

    restore_times = []
    restore = engine.scheduler.restore

    def timed_restore(tokens, salt):
        t0 = time.perf_counter()
        done = restore(tokens, salt)
        restore_times.append(time.perf_counter() - t0)
        return done

    engine.scheduler.restore = timed_restore
    restored = timed_request(engine, prompt, params)
    engine.scheduler.restore = restore
    after = engine.stats()

    engine.unpin_prefix(handle)  # a second cold prefill, with nothing cached anywhere
    spill.host.clear()
    cache.clear()
    cold_again = timed_request(engine, prompt, params)
    cold_best = min(cold_first["ttft_s"], cold_again["ttft_s"])
    print(
        json.dumps(
            {
                "model": model,
                "kv_cache_dtype": engine.kv_dtype,
                "threads": os.cpu_count(),
                "prompt_tokens": len(prompt),
                "pinned_prefix_tokens": len(prefix),
                "spill": {
                    "pages": spilled["kv_spilled_to_host_pages"],
                    "bytes": spilled["kv_host_tier_bytes"],
                    "seconds": round(spill_s, 3),
                },
                "cold_ttft_s": [cold_first["ttft_s"], cold_again["ttft_s"]],
                "resident_ttft_s": resident["ttft_s"],
                "restored": {
                    "ttft_s": restored["ttft_s"],
                    "restore_s": round(sum(restore_times), 3),
                    "cached_tokens": restored["cached_tokens"],
                    "pages_from_host": after["kv_restored_from_host_pages"],
                },
                "ratio_restored_to_cold": round(restored["ttft_s"] / cold_best, 3),
                "same_greedy_tokens": restored["tokens"]
                == resident["tokens"]
                == cold_first["tokens"]
                == cold_again["tokens"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
