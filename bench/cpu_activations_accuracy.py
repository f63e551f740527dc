"""Perplexity and top-1 agreement of the CPU activation choices against float32; prints JSON.

    python bench/cpu_activations_accuracy.py [--windows N]

The default model, teacher-forced over 1024-token windows of Python source
(this Python's standard library) and of prose (licence texts), the last 32
tokens of each window as decode steps: float32 (the reference), BF16
activations (`--cpu-kernel bf16`), int8 activations (`--cpu-kernel int8`), and
int8 activations with the C attention kernels (`--attention-backend auto`, what
`resident serve` runs on CPU: BF16 prefill attention, float32 decode attention).
"""

from __future__ import annotations

import argparse
import gc
import json

import torch

from engine import LLM
from engine.devtools.benchmarks.accuracy import prose_text, python_text, score_window
from engine.model_files.store import default_model_dir

VARIANTS = {
    "float32": {"dtype": "float32"},
    "bf16_activations": {"dtype": "bfloat16", "cpu_kernel": "bf16"},
    "int8_activations": {"dtype": "bfloat16", "cpu_kernel": "int8"},
    "int8_cpu_attention": {"dtype": "bfloat16", "cpu_kernel": "int8", "attention_backend": "auto"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=4, help="Python windows (prose: half)")
    args = parser.parse_args()
    context = 1024
    scores = {}
    for name, settings in VARIANTS.items():
        llm = LLM(str(default_model_dir()), kv_cache_dtype="bf16", **settings)
        tokenizer = llm.engine.tokenizer
        texts = {
            "python": python_text(tokenizer, context * args.windows).ids,
            "prose": prose_text(tokenizer, context * max(1, args.windows // 2)).ids,
        }
        scores[name] = {
            text: torch.cat(
                [
                    score_window(llm, ids[i : i + context], 32)[0]
                    for i in range(0, len(ids) - context + 1, context)
                ]
            )
            for text, ids in texts.items()
        }
        del llm
        gc.collect()
    result = {"benchmark": "cpu_activations_accuracy", "context": context, "rows": []}
    for name, by_text in scores.items():
        for text, got in by_text.items():
            ref = scores["float32"][text]
            ppl, ref_ppl = float(torch.exp(got[:, 0].mean())), float(torch.exp(ref[:, 0].mean()))
            result["rows"].append(
                {
                    "variant": name,
                    "text": text,
                    "positions": int(got.shape[0]),
                    "ppl": round(ppl, 4),
                    "delta_pct": round((ppl / ref_ppl - 1) * 100, 3),
                    # per-position error; delta_pct nets errors of both signs out
                    "mean_abs_nll_diff": round(float((got[:, 0] - ref[:, 0]).abs().mean()), 4),
                    "top1_agreement": round(float((got[:, 1] == ref[:, 1]).double().mean()), 4),
                }
            )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
