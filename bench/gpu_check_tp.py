"""Tensor-parallel section of the GPU check: TP 1, 2, 4, 8 as far as the GPUs go.

For each model (the mid-size random GLM-MoE and Kimi of bench/gpu_check_e2e.py)
and each TP size that fits the visible GPUs (TP 1 only on a single GPU), the
engine serves a batch of prompts with `LLM(..., tensor_parallel_size=N)`
(Triton attention, FP8 KV, BF16 weights): greedy tokens, compared with TP 1
(the share of identical tokens; BF16 sums in another order may flip a close
call late in a sequence, so the first tokens are the sharp part), and decode
tokens/s. With --smoke it runs tiny models on CPU ranks over gloo (TP 1 and
2), which the test suite uses to keep this script working.

    python bench/gpu_check_tp.py --out gpu_check_tp.json
    python bench/gpu_check_tp.py --smoke

Prints JSON rows; errors are reported per row, never raised.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_check_e2e import SIZES, build_model  # noqa: E402

SETTINGS = {
    "full": dict(batch=16, prompt=512, tokens=32, kv="fp8_e4m3", kv_gib=8.0, dtype="bfloat16"),
    "smoke": dict(batch=3, prompt=24, tokens=4, kv="fp8_e4m3", kv_gib=0.02, dtype="float32"),
}


def tp_sizes(smoke: bool) -> list[int]:
    if smoke:
        return [1, 2]
    gpus = torch.cuda.device_count()
    return [n for n in (1, 2, 4, 8) if n <= gpus]


def _generate(path: Path, tp: int, prompts, setting: dict, device: str) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(
        str(path),
        dtype=setting["dtype"],
        kv_cache_dtype=setting["kv"],
        tensor_parallel_size=tp,
        enable_prefix_caching=False,
        max_num_seqs=len(prompts),
        max_model_len=setting["prompt"] + setting["tokens"] + 16,
        kv_memory=setting["kv_gib"],
        device=device,
    )
    try:
        llm.generate(prompts, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        spent, outputs = [], None
        for tokens in (1, setting["tokens"] + 1):
            params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            if device == "cuda":
                torch.cuda.synchronize()
            spent.append(time.perf_counter() - start)
        rate = len(prompts) * setting["tokens"] / max(spent[1] - spent[0], 1e-9)
        return {
            "tokens": [o.outputs[0].token_ids for o in outputs],
            "decode_tok_s": round(rate, 1),
            "prefill_s": round(spent[0], 3),
        }
    finally:
        close = getattr(llm, "close", None)
        if close is not None:
            close()
        del llm
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def run_tp(smoke: bool = False) -> list[dict]:
    mode = "smoke" if smoke else "full"
    setting = SETTINGS[mode]
    device = "cpu" if smoke else "cuda"
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(10, 200, (setting["prompt"],), generator=generator).tolist()
        for _ in range(setting["batch"])
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("glm4_moe", "kimi"):
            length = 2 * (setting["prompt"] + setting["tokens"]) + 64
            path = build_model(family, Path(tmp) / family, SIZES[mode], length)
            baseline = None
            for tp in tp_sizes(smoke):
                row = {"model": family, "tp": tp, "kv": setting["kv"]}
                try:
                    result = _generate(path, tp, prompts, setting, device)
                except Exception as err:  # report and go on
                    rows.append({**row, "error": repr(err)[:300]})
                    continue
                tokens = result.pop("tokens")
                if baseline is None:
                    baseline = tokens
                pairs = list(zip(tokens, baseline, strict=True))
                same = sum(a == b for x, y in pairs for a, b in zip(x, y, strict=True))
                total = sum(len(x) for x in baseline)
                first_same = sum(x[0] == y[0] for x, y in pairs)
                row.update(result)
                row["tokens_equal_tp1"] = round(same / max(total, 1), 4)
                row["first_tokens_equal_tp1"] = f"{first_same}/{len(baseline)}"
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models, CPU ranks (gloo)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        parser.error("no GPU here: use --smoke")
    rows = run_tp(args.smoke)
    text = json.dumps(rows, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
