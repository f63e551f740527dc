"""Decode throughput: the engine (BF16 and FP8 KV) against transformers' `generate`.

Both run in one process on the same machine and weights, one after the other,
so the ratios are comparable even where absolute numbers are noisy. Every run
generates exactly `max_tokens` tokens per prompt (EOS ignored), with the
engine's prefix cache off so no run reuses another's prompt (transformers has
no such cache). Each measurement is the best of `repeats` timed runs after an
untimed one, on both sides, which keeps a noisy neighbour's bursts out of the
ratio. Each side also prefills one cold prompt of `prefill_tokens` tokens, the
agent's first request over a repository: prompt tokens per second.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from engine.kv.dtypes import SERVING_KV_DTYPES

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash map is to a new programmer.",
    "What does the `git rebase` command do?",
    "Summarise the plot of Hamlet in three sentences.",
    "List five uses of the Unix `find` command.",
    "How do I read a CSV file with pandas?",
    "What is the difference between a process and a thread?",
    "Give me a haiku about compilers.",
]


def _chat_ids(tokenizer, text: str) -> list[int]:
    from engine.rendering import ChatRenderer

    return ChatRenderer(tokenizer).render([{"role": "user", "content": text}]).token_ids


def _long_prompt(prompts: list[list[int]], length: int) -> list[int]:
    """`length` tokens of real text: the chat prompts end to end, repeated."""
    ids: list[int] = []
    while len(ids) < length:
        ids.extend(token for prompt in prompts for token in prompt)
    return ids[:length]


def _best_rate(run, repeats: int) -> float:
    """Items per second of `run()` (which returns its item count): best of `repeats`."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        count = run()
        best = max(best, count / (time.perf_counter() - start))
    return best


def _rates(generate, prefill, prompts: list[list[int]], repeats: int) -> dict:
    """The three figures of one side: `generate(batch)` and `prefill()` return counts."""
    generate([prompts[0]])  # warm-up, untimed
    return {
        "single_tok_s": _best_rate(lambda: generate([prompts[0]]), repeats),
        "batch_tok_s": _best_rate(lambda: generate(prompts), repeats),
        "prefill_tok_s": _best_rate(prefill, repeats),
    }


def _engine_run(
    model: str,
    kv: str,
    prompts: list[list[int]],
    max_tokens: int,
    long_prompt: list[int],
    repeats: int,
    attention_backend: str | None = None,
) -> dict:
    from engine import LLM, SamplingParams
    from engine.kv.calibration import calibrate_without_fixed_scales

    # LLM's defaults are `resident serve`'s (engine.config.engine_settings), so this
    # measures the engine the server and the agent run; a backend given forces one.
    llm = LLM(
        model,
        kv_cache_dtype=kv,
        attention_backend=attention_backend,
        enable_prefix_caching=False,
    )
    # FP8 scales as `resident serve` sets them, not from the short warm-up prompt.
    calibrate_without_fixed_scales(llm)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def generate(batch: list[list[int]]) -> int:
        return sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params))

    def prefill() -> int:
        llm.generate([long_prompt], SamplingParams(max_tokens=1, temperature=0))
        return len(long_prompt)

    return {
        **_rates(generate, prefill, prompts, repeats),
        **_prefill_by_matrix_path(llm, prefill, repeats),
        "kv_bytes_per_token": llm.engine.pool.layout.values_per_token
        * llm.engine.pool.storage.element_size(),
        "attention_backend": llm.engine.runner.backend.name,
        "cpu_kernel": llm.engine.cpu_kernel,
    }


def _prefill_by_matrix_path(llm, prefill, repeats: int) -> dict:
    """Prefill on each CPU path for grid weights (int8 VNNI, BF16 tiles: AMX where the
    CPU has it), whichever the engine picks by default; decode steps are not affected
    (they stay on VNNI below `BF16_MIN_ROWS` rows)."""
    from engine.layers.cpu_matrix_path import PATHS, describe_matrix_path, use_matrix_path

    if "cpu-grid" not in llm.engine.linear_methods:
        return {}
    figures = {}
    for path in PATHS:
        with use_matrix_path(path):
            figures[f"prefill_tok_s_{path}"] = _best_rate(prefill, repeats)
    return {**figures, **describe_matrix_path()}


def _transformers_run(
    model_dir: str,
    prompts: list[list[int]],
    max_tokens: int,
    dtype,
    long_prompt: list[int],
    repeats: int,
) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    pad = model.config.pad_token_id or 0

    def generate(batch: list[list[int]]) -> int:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
        return (out.shape[1] - width) * len(batch)

    def prefill() -> int:
        with torch.inference_mode():
            model(input_ids=torch.tensor([long_prompt]), logits_to_keep=1)
        return len(long_prompt)

    return _rates(generate, prefill, prompts, repeats)


def run_throughput(
    model: str,
    max_tokens: int = 128,
    batch: int = 16,
    with_transformers: bool = True,
    prefill_tokens: int = 4096,
    repeats: int = 3,
    attention_backend: str | None = None,
) -> dict:
    from engine.host.cpu_features import describe_cpu
    from engine.model_files.model_config import load_config
    from engine.model_files.store import resolve_model
    from engine.tokenizers.loading import load_tokenizer

    model_dir = str(resolve_model(model))
    context = load_config(Path(model_dir)).max_position_embeddings
    if prefill_tokens >= context:
        raise ValueError(
            f"--prefill-tokens {prefill_tokens} does not fit the model's context of {context} "
            "tokens (the prompt plus one generated token); take at most "
            f"{context - 1}"
        )
    tokenizer = load_tokenizer(Path(model_dir))
    prompts = [_chat_ids(tokenizer, PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
    long_prompt = _long_prompt(prompts, prefill_tokens)
    result = {
        "benchmark": "throughput",
        "model": model,
        "max_tokens": max_tokens,
        "batch": batch,
        "prompt_tokens": [len(p) for p in prompts],
        "prefill_tokens": prefill_tokens,
        "repeats": repeats,
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            **describe_cpu(),
        },
        "runs": {},
    }
    runs = result["runs"]
    for kv in SERVING_KV_DTYPES:
        runs[f"engine_{kv}"] = _engine_run(
            model_dir, kv, prompts, max_tokens, long_prompt, repeats, attention_backend
        )
    if with_transformers:
        runs["transformers_bf16"] = _transformers_run(
            model_dir, prompts, max_tokens, torch.bfloat16, long_prompt, repeats
        )
        base = runs["transformers_bf16"]
        result["speedup_vs_transformers"] = {
            name: {
                "single": runs[name]["single_tok_s"] / base["single_tok_s"],
                "batch": runs[name]["batch_tok_s"] / base["batch_tok_s"],
                "prefill": runs[name]["prefill_tok_s"] / base["prefill_tok_s"],
            }
            for name in runs
            if name.startswith("engine_")
        }
    return result


def format_table(result: dict) -> str:
    lines = [f"{'run':22} {'single tok/s':>14} {'batch tok/s':>14} {'prefill tok/s':>14}"]
    for name, run in result["runs"].items():
        lines.append(
            f"{name:22} {run['single_tok_s']:14.1f} {run['batch_tok_s']:14.1f}"
            f" {run['prefill_tok_s']:14.1f}"
        )
    for name, ratio in result.get("speedup_vs_transformers", {}).items():
        lines.append(
            f"{name} vs transformers: single x{ratio['single']:.2f}, batch x{ratio['batch']:.2f},"
            f" prefill x{ratio['prefill']:.2f}"
        )
    return "\n".join(lines)
