"""Where FP8 KV scales come from, and what each source costs in accuracy. Prints JSON.

Scores the accuracy bench's Python text (CPython's stdlib) with BF16 KV and
with rotated FP8 KV whose scales were set by: the first prefill being the
first scored window; a server's start-up sample followed by a first request
of "hi"; a first prefill of "hi" alone (what a server did before start-up
calibration); and, with --scales-file, a file from `resident models
calibrate`. Per variant: perplexity change against BF16 KV, top-1 agreement
and the mean absolute per-position NLL change.

    python bench/kv_scale_sources.py [--scales-file scales.json] [--windows 4]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from engine import LLM, SamplingParams
from engine.devtools.benchmarks.accuracy import _windows, python_text, score_window
from engine.kv.calibration import calibrate_without_fixed_scales

MODEL = "smollm2-135m-instruct"
CONTEXT = 2048
DECODE_TOKENS = 32  # as the accuracy bench: the last tokens of each window run as decode


def _first_request_hi(llm: LLM) -> None:
    llm.generate(["hi"], SamplingParams(max_tokens=1, temperature=0))


def _startup_sample_then_hi(llm: LLM) -> None:
    calibrate_without_fixed_scales(llm)
    _first_request_hi(llm)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--windows", type=int, default=4, help="2,048-token windows scored")
    parser.add_argument("--scales-file", help="a file from `resident models calibrate`")
    args = parser.parse_args()

    reference = LLM(args.model, kv_cache_dtype="bf16", attention_backend="auto")
    text = python_text(reference.tokenizer, CONTEXT * args.windows)
    windows = _windows(text.ids, CONTEXT, args.windows)

    def scores(llm: LLM) -> torch.Tensor:
        return torch.cat([score_window(llm, w, DECODE_TOKENS)[0] for w in windows])

    ref = scores(reference)
    del reference
    fp8 = {"kv_cache_dtype": "fp8_e4m3", "kv_rotation": "hadamard", "attention_backend": "auto"}
    variants = {
        "first_prefill_is_the_first_window": (fp8, None),
        "startup_sample_then_hi": (fp8, _startup_sample_then_hi),
        "first_prefill_is_hi": (fp8, _first_request_hi),
    }
    if args.scales_file:
        variants["scales_file"] = (
            {**fp8, "kv_rotation": "auto", "kv_scales_file": args.scales_file},
            None,
        )
    base = math.exp(ref[:, 0].mean().item())
    result = {
        "model": args.model,
        "text": text.source,
        "windows": len(windows),
        "positions": int(ref.shape[0]),
        "bf16_perplexity": round(base, 4),
        "variants": {},
    }
    for name, (config, before) in variants.items():
        llm = LLM(args.model, **config)
        if before is not None:
            before(llm)
        got = scores(llm)
        result["variants"][name] = {
            "scale_source": llm.engine.pool.scale_source,
            "perplexity_delta_pct": round(100 * (math.exp(got[:, 0].mean().item()) / base - 1), 3),
            "top1_agreement": round((got[:, 1] == ref[:, 1]).double().mean().item(), 4),
            "mean_abs_nll_diff": round((got[:, 0] - ref[:, 0]).abs().mean().item(), 4),
        }
        del llm
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
