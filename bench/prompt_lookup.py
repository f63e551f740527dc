"""Decode speed with and without prompt-lookup speculation (issue 18, item 3); prints JSON.

Two workloads on one engine, greedy, one request at a time:
- editing: the model is given a file of this repository and asked to return it
  with one identifier renamed, and to return one function with one line changed
  (the answer is mostly a copy of the context);
- nothing to copy: open-ended prose with no context to copy from;
- the editing prompts again, sampled at temperature 0.7 with seed 0 (same tokens
  with and without speculation; drafts are kept only where the draw agrees).

Each prompt runs once untimed (prefix cache warm, FP8 scales set), then plain and
speculative runs alternate `--repeats` times; the best of each counts. Decode
tokens/s = (output tokens - 1) / (time of the last token - time of the first),
so prefill is left out. Also reported: whether the two outputs are identical,
and the acceptance rate (accepted / drafted tokens) and tokens per verification.

    .venv/bin/python bench/prompt_lookup.py [--model M] [--max-tokens N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from engine import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "engine" / "kv" / "pages.py"

CODE_ONLY = "Reply with the code only, in one ```python block."


def editing_prompts() -> list[tuple[str, list[dict]]]:
    text = SOURCE.read_text()
    file_msg = f"Here is the file engine/kv/pages.py:\n\n```python\n{text}```\n\n"
    return [
        (
            "rename",
            [
                {
                    "role": "user",
                    "content": file_msg + "Return the whole file with the attribute "
                    f"`_refcount` renamed to `_holders` everywhere. {CODE_ONLY}",
                }
            ],
        ),
        (
            "one_line",
            [
                {
                    "role": "user",
                    "content": file_msg + "Return the method `release` with its error "
                    "message changed to 'page released twice'. Keep every other line as "
                    f"it is. {CODE_ONLY}",
                }
            ],
        ),
    ]


def prose_prompts() -> list[tuple[str, list[dict]]]:
    asks = [
        ("story", "Write a short story about a lighthouse keeper who finds a message."),
        ("explain", "Explain in a few paragraphs why the sky is blue and sunsets are red."),
    ]
    return [(name, [{"role": "user", "content": ask}]) for name, ask in asks]


def timed(llm: LLM, ids: list[int], params: SamplingParams) -> tuple[list[int], float]:
    """Output tokens and decode tokens/s of one request run alone."""
    engine = llm.engine
    seq = engine.add_request(ids, params)
    first = last = None
    while engine.has_unfinished():
        engine.step()
        now = time.perf_counter()
        if seq.output_token_ids and first is None:
            first = now
        last = now
    tokens = list(seq.output_token_ids)
    span = (last - first) if first is not None else 0.0
    return tokens, (len(tokens) - 1) / span if span > 0 else 0.0


def run_workload(
    llm: LLM, prompts, max_tokens: int, repeats: int, temperature: float = 0.0
) -> dict:
    results = []
    for name, messages in prompts:
        ids = llm.render_chat(messages).token_ids
        params = {
            flag: SamplingParams(
                max_tokens=max_tokens, temperature=temperature, seed=0, speculative=flag
            )
            for flag in (False, True)
        }
        timed(llm, ids, params[False])  # warm: cached prompt, scales set
        best = {False: 0.0, True: 0.0}
        outputs = {}
        before = llm.engine.speculator.stats()
        for _ in range(repeats):
            for flag in (False, True):
                tokens, rate = timed(llm, ids, params[flag])
                best[flag] = max(best[flag], rate)
                outputs[flag] = tokens
        after = llm.engine.speculator.stats()
        drafted = after["speculative_drafted_tokens"] - before["speculative_drafted_tokens"]
        accepted = after["speculative_accepted_tokens"] - before["speculative_accepted_tokens"]
        steps = after["speculative_steps"] - before["speculative_steps"]
        results.append(
            {
                "prompt": name,
                "prompt_tokens": len(ids),
                "output_tokens": len(outputs[True]),
                "plain_tok_s": round(best[False], 1),
                "speculative_tok_s": round(best[True], 1),
                "speedup": round(best[True] / best[False], 2) if best[False] else None,
                "identical_output": outputs[True] == outputs[False],
                "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
                "tokens_per_verification": round((accepted + steps) / steps, 2) if steps else None,
            }
        )
    plain = sum(r["output_tokens"] / r["plain_tok_s"] for r in results if r["plain_tok_s"])
    spec = sum(
        r["output_tokens"] / r["speculative_tok_s"] for r in results if r["speculative_tok_s"]
    )
    return {"prompts": results, "speedup_total_time": round(plain / spec, 2) if spec else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    llm = LLM(args.model)
    report = {
        "model": args.model,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, "
        f"{'cuda' if torch.cuda.is_available() else 'cpu'}",
        "engine": {
            key: llm.engine.stats()[key]
            for key in ("kv_cache_dtype", "attention_backend", "cpu_kernel")
        },
        "max_draft": llm.config.speculative_max_draft,
        "editing": run_workload(llm, editing_prompts(), args.max_tokens, args.repeats),
        # Seeded sampling: the same tokens with and without speculation, fewer kept drafts.
        "editing_sampled_t0.7": run_workload(
            llm, editing_prompts(), args.max_tokens, args.repeats, temperature=0.7
        ),
        "nothing_to_copy": run_workload(llm, prose_prompts(), args.max_tokens, args.repeats),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
