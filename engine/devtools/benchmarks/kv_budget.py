"""The published FP8-KV experiment at small scale: one KV budget, N sequences in BF16, 2N in FP8.

Published (Kimi K2.6 on H200s with SGLang): BF16 KV holds 32 concurrent
requests, FP8 KV 64, for +41% throughput. Here: fix a budget that holds
exactly N sequences of `prompt + output` tokens in BF16; FP8 then holds 2N.
Each configuration runs the same workload (2N requests, EOS ignored) with as
many concurrent sequences as its capacity allows, and the aggregate decode
throughput (generated tokens / wall time) is compared. A third configuration,
FP8 at BF16's concurrency, separates FP8's per-token read cost from the
concurrency its capacity buys.

All engines are loaded first and the configurations are run in rotating
order for several rounds, so that a shared machine's changing load falls on
all of them alike; ratios are taken within each round, then the median.
"""

from __future__ import annotations

import random
import statistics
import time

from engine.devtools.benchmarks.serving import DEFAULT_MODEL, machine

GIB = 1024**3


def _engine(model: str, kv_dtype: str, budget_gib: float, seq_len: int, concurrency: int):
    from engine import LLM, SamplingParams

    llm = LLM(
        model,
        kv_cache_dtype=kv_dtype,
        kv_memory=budget_gib,
        max_model_len=seq_len,
        max_num_seqs=concurrency,
        enable_prefix_caching=False,  # every prompt is distinct anyway; keep pages honest
    )
    if llm.engine.capacity_tokens // seq_len < concurrency:
        raise RuntimeError(f"{kv_dtype}: the budget does not hold {concurrency} sequences")
    llm.generate([[100, 101, 102, 103]], SamplingParams(max_tokens=2))  # warm-up
    return llm


def _throughput(llm, prompts: list[list[int]], max_tokens: int) -> float:
    from engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds


def run_kv_budget(
    model: str = DEFAULT_MODEL,
    bf16_sequences: int = 8,
    prompt_tokens: int = 64,
    max_tokens: int = 64,
    rounds: int = 3,
) -> dict:
    """Throughput at the concurrency one KV budget allows, BF16 against FP8."""
    from engine.kv.sizing import kv_bytes_per_token
    from engine.llm import LLM

    seq_len = prompt_tokens + max_tokens
    sizing = LLM(model, kv_cache_dtype="bf16", max_model_len=seq_len, kv_memory=0.05)
    bf16_bytes = kv_bytes_per_token(sizing.engine.layout, "bf16")
    fp8_bytes = kv_bytes_per_token(sizing.engine.layout, "fp8_e4m3")
    vocab = sizing.engine.model_config.vocab_size
    del sizing
    # Exactly N sequences' pages in BF16 (seq_len is a whole number of pages); the extra
    # token's bytes keep float rounding from costing a page.
    budget_gib = (bf16_sequences * seq_len + 1) * bf16_bytes / GIB
    fp8_sequences = bf16_sequences * bf16_bytes // fp8_bytes
    configs = {
        "bf16": ("bf16", bf16_sequences),
        "fp8_e4m3_at_bf16_concurrency": ("fp8_e4m3", bf16_sequences),
        "fp8_e4m3": ("fp8_e4m3", fp8_sequences),
    }
    engines = {
        name: _engine(model, kv, budget_gib, seq_len, concurrency)
        for name, (kv, concurrency) in configs.items()
    }
    rng = random.Random(0)
    names = list(configs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        # Fresh prompts each round (no config sees a cached prompt), same for every config.
        prompts = [
            [rng.randrange(100, vocab) for _ in range(prompt_tokens)]
            for _ in range(2 * bf16_sequences)
        ]
        for offset in range(len(names)):
            name = names[(round_index + offset) % len(names)]
            samples[name].append(_throughput(engines[name], prompts, max_tokens))

    def ratio(numerator: str, denominator: str) -> dict:
        per_round = [a / b for a, b in zip(samples[numerator], samples[denominator], strict=True)]
        return {
            "median": round(statistics.median(per_round), 3),
            "per_round": [round(r, 3) for r in per_round],
        }

    return {
        "benchmark": "kv_budget",
        "model": model,
        "kv_budget_gib": round(budget_gib, 5),
        "sequence_tokens": seq_len,
        "requests_per_run": 2 * bf16_sequences,
        "rounds": rounds,
        "kv_bytes_per_token": {"bf16": bf16_bytes, "fp8_e4m3": fp8_bytes},
        "runs": {
            name: {
                "capacity_tokens": engines[name].engine.capacity_tokens,
                "concurrent_sequences": configs[name][1],
                "decode_tok_s_median": round(statistics.median(samples[name]), 2),
                "decode_tok_s_per_round": [round(s, 2) for s in samples[name]],
            }
            for name in names
        },
        "fp8_over_bf16_concurrency": fp8_sequences / bf16_sequences,
        "fp8_over_bf16_throughput": ratio("fp8_e4m3", "bf16"),
        "fp8_2n_over_fp8_n_throughput": ratio("fp8_e4m3", "fp8_e4m3_at_bf16_concurrency"),
        "fp8_n_over_bf16_n_throughput": ratio("fp8_e4m3_at_bf16_concurrency", "bf16"),
        "published": "Kimi K2.6 on 8xH200 (SGLang): 32 -> 64 concurrent requests, +41% throughput",
        "machine": machine(),
    }
