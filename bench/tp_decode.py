"""Decode tokens/s with tensor parallelism 2 against 1 on this CPU: the overhead, as a ratio.

A CPU is not the target of tensor parallelism (the ranks split the same
cores); this shows what the step broadcast and the two all-reduces per
layer cost. A generated Llama (hidden 1024, 8 layers, float32; engine/
testing/wide_checkpoint.py) serves a batch of prompts greedily through
`LLM(..., tensor_parallel_size=N)` for each N, in one run.

    python bench/tp_decode.py [--batch 8] [--tokens 32] [--layers 8]

Prints JSON: per TP size, decode tokens/s, and the ratio to TP 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.gpu_check_tp import _generate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    setting = dict(
        batch=args.batch, prompt=64, tokens=args.tokens, kv="bf16", kv_gib=0.2, dtype="float32"
    )
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(10, 300, (64,), generator=generator).tolist() for _ in range(args.batch)
    ]
    with tempfile.TemporaryDirectory() as scratch:
        from engine.devtools.testing.wide_checkpoint import write_wide_llama

        path = write_wide_llama(Path(scratch) / "wide", layers=args.layers, vocab=8192)
        rows, baseline = [], None
        for tp in args.tp:
            result = _generate(path, tp, prompts, setting, "cpu")
            tokens = result.pop("tokens")
            baseline = baseline or (result["decode_tok_s"], tokens)
            result.update(
                tp=tp,
                ratio_to_tp1=round(result["decode_tok_s"] / baseline[0], 3),
                tokens_equal_tp1=tokens == baseline[1],
            )
            rows.append(result)
    print(json.dumps({"batch": args.batch, "tokens": args.tokens, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
