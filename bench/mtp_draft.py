"""Decode speed with and without MTP speculation on a random DeepSeek-V3-shaped model
(issue 41, item 1); prints JSON.

No real MTP weights can be fetched here, so two random checkpoints of one shape,
with one MTP layer appended (engine/devtools/testing/mtp_layers.py):
- random: the MTP layer is random, so its drafts are nearly always rejected. This
  measures what MTP costs when it does not help (the MTP pass each step, and
  each verification of [last token, draft] as 2 rows);
- copying: the MTP layer provably predicts the target's next token (attention and
  MLP outputs zeroed, which leaves every matrix product in place), so every draft
  is accepted. This measures the ceiling: what full acceptance buys at this size.
Real MTP layers land in between (vLLM and SGLang report 80-90% for DeepSeek V3's
first draft token on real text); acceptance on real weights cannot be measured here.

Greedy, one request at a time, each prompt once untimed, then plain and MTP runs
alternate `--repeats` times and the best of each counts. Decode tokens/s =
(output tokens - 1) / (time of the last token - time of the first).

    .venv/bin/python bench/mtp_draft.py [--max-tokens N] [--repeats R] [--tokens K ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from engine import LLM, SamplingParams
from engine.devtools.testing.checkpoints import build_deepseek_v3
from engine.devtools.testing.mtp_layers import add_mtp_layers

# DeepSeek V3's layout at a size two CPU cores decode in seconds (about 0.2B parameters).
SHAPE = dict(
    vocab_size=8192,
    hidden_size=1024,
    intermediate_size=2816,
    moe_intermediate_size=512,
    num_hidden_layers=6,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_routed_experts=16,
    num_experts_per_tok=2,
    kv_lora_rank=256,
    q_lora_rank=512,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
    max_position_embeddings=4096,
)
PROMPTS = [[(7 * i + 3 * j) % 8000 + 100 for j in range(24 + 8 * i)] for i in range(3)]


def run_case(path: Path, args) -> dict:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    common = dict(dtype="bfloat16", kv_cache_dtype="auto", max_model_len=1024)
    plain = LLM(str(path), **common)
    result = {}
    for tokens in args.tokens:
        mtp = LLM(str(path), speculative="mtp", speculative_mtp_tokens=tokens, **common)
        best_plain, best_mtp, identical = 0.0, 0.0, True
        for prompt in PROMPTS:
            want = plain.generate([prompt], params)[0].outputs[0].token_ids
            got = mtp.generate([prompt], params)[0].outputs[0].token_ids
            identical &= got == want
            rates_plain, rates_mtp = [], []
            for _ in range(args.repeats):
                rates_plain.append(_timed(plain, prompt, params))
                rates_mtp.append(_timed(mtp, prompt, params))
            best_plain += max(rates_plain) / len(PROMPTS)
            best_mtp += max(rates_mtp) / len(PROMPTS)
        stats = mtp.engine.speculator.stats()
        result[f"mtp_tokens_{tokens}"] = {
            "plain_decode_tokens_per_s": round(best_plain, 2),
            "mtp_decode_tokens_per_s": round(best_mtp, 2),
            "speedup": round(best_mtp / best_plain, 3),
            "acceptance_rate": round(stats["speculative_acceptance_rate"], 4),
            "tokens_per_verification": round(
                1 + stats["speculative_accepted_tokens"] / max(stats["speculative_steps"], 1), 3
            ),
            "identical_outputs": identical,
        }
    return result


def _timed(llm: LLM, prompt: list[int], params: SamplingParams) -> float:
    """Decode tokens/s of one request: the first token's time (prefill) left out."""
    engine = llm.engine
    seq = engine.add_request(prompt, params)
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None and seq.output_token_ids:
            first, count = time.perf_counter(), len(seq.output_token_ids)
    return (len(seq.output_token_ids) - count) / (time.perf_counter() - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    report = {
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "shape": SHAPE,
        "max_tokens": args.max_tokens,
    }
    with tempfile.TemporaryDirectory() as scratch:
        for case, copying in (("random", False), ("copying", True)):
            path = build_deepseek_v3(Path(scratch) / case, **SHAPE)
            add_mtp_layers(path, copying=copying)
            report[case] = run_case(path, args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
