"""What --deterministic costs and what it buys, on the default model; prints JSON.

Cost: decode throughput with and without it (single stream and a batch of 16).
Buys: without it, how often a greedy request's tokens differ alone vs in a
batch of 32, and cold vs from the prefix cache; with it, both must be 100%.

    OMP_NUM_THREADS=1 python bench/deterministic.py [--kv fp8_e4m3]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from engine import LLM, SamplingParams

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is a hash map?",
    "Name three sorting algorithms.",
    "What does git rebase do?",
    "Explain recursion briefly.",
    "What is a race condition?",
    "Why use version control?",
    "What is a unit test?",
    "Define big-O notation.",
]
PREFIX = "You review Python code carefully. " + " ".join(
    f"Rule {i}: keep functions short and names clear." for i in range(40)
)


def chat_ids(llm: LLM, question: str, system: str | None = None) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    text = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def throughput(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start)


def agreement(llm: LLM, tokens: int) -> dict:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    prompts = [chat_ids(llm, q) for q in QUESTIONS]
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    batch = [o.outputs[0].token_ids for o in llm.generate(prompts * 4, params)]
    batch_same = sum(batch[i] == alone[i % len(alone)] for i in range(len(batch))) / len(batch)
    with_prefix = [chat_ids(llm, q, PREFIX) for q in QUESTIONS]
    llm.engine.prefix_cache.clear()
    cold = []
    for p in with_prefix:  # each cold: clear the cache before it
        llm.engine.prefix_cache.clear()
        cold.append(llm.generate([p], params)[0])
    warm = [llm.generate([p], params)[0] for p in with_prefix]
    assert all(c.num_cached_tokens == 0 for c in cold) and all(w.num_cached_tokens for w in warm)
    cached_same = sum(
        c.outputs[0].token_ids == w.outputs[0].token_ids for c, w in zip(cold, warm, strict=True)
    ) / len(cold)
    return {"alone_vs_batch_of_32_identical": batch_same, "cold_vs_cached_identical": cached_same}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kv", default="fp8_e4m3")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    result = {
        "benchmark": "deterministic",
        "model": MODEL,
        "kv_cache_dtype": args.kv,
        "tokens_per_request": args.tokens,
        "torch_threads": torch.get_num_threads(),
        "modes": {},
    }
    for deterministic in (False, True):
        llm = LLM(MODEL, kv_cache_dtype=args.kv, deterministic=deterministic)
        llm.generate([chat_ids(llm, "warm up")], SamplingParams(max_tokens=2))  # calibrates
        prompts = [chat_ids(llm, q) for q in QUESTIONS] * 2
        result["modes"]["deterministic" if deterministic else "default"] = {
            "single_tok_s": throughput(llm, prompts[:1], args.tokens),
            "batch16_tok_s": throughput(llm, prompts, args.tokens),
            **agreement(llm, 12),
        }
    default, det = result["modes"]["default"], result["modes"]["deterministic"]
    result["deterministic_cost"] = {
        "single": det["single_tok_s"] / default["single_tok_s"],
        "batch16": det["batch16_tok_s"] / default["batch16_tok_s"],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
