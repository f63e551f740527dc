"""What `--cpu-weights q8_0|q4_0` costs in quality, on the default model; prints JSON.

    python bench/cpu_weights_accuracy.py [--tokens 8192] [--context 2048]

The default model's folder holds float32 weights on the Q4_1 grid (it ships as
a Q4_1 GGUF), the stand-in here for a dense checkpoint: its linear weights
are rounded onto Q8_0 and onto Q4_0 exactly as `--cpu-weights` rounds a
dense checkpoint at load (engine/weights/grid_rounding.py; the head takes
Q8_0 under q4_0), written as sibling folders, and each variant's perplexity
and top-1 agreement with the original are measured over CPython standard
library source, through the engine as served (BF16, FP8 KV, int8 grid
kernel). No dense BF16 model of this size is at hand without a model hub, so
the figures are a requantization's cost on top of Q4_1, the same rounding a
dense checkpoint would take.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine import LLM
from engine.devtools.benchmarks.accuracy import python_text, score_window
from engine.model_files.store import default_model_dir
from engine.weights.grid_rounding import GRIDS

HEAD = "lm_head.weight"


def requantized(source: Path, grid: str, target: Path) -> Path:
    """A copy of `source` with its 2-D weights (32-wide rows) rounded onto `grid`."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    for shard in source.glob("*.safetensors"):
        tensors = load_file(str(shard))
        for name, tensor in tensors.items():
            if tensor.dim() == 2 and tensor.shape[1] % 32 == 0 and "embed_tokens" not in name:
                tensors[name] = GRIDS["q8_0" if name == HEAD else grid](tensor)
        save_file(tensors, str(target / shard.name), metadata={"format": "pt"})
    return target


def measure(folder: Path, windows: list[list[int]]) -> torch.Tensor:
    llm = LLM(str(folder), dtype="bfloat16", kv_cache_dtype="fp8_e4m3")
    rows = [score_window(llm, window, decode_tokens=0)[0] for window in windows]
    return torch.cat(rows)  # [positions, (NLL, argmax)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--context", type=int, default=2048)
    args = parser.parse_args()
    source = default_model_dir()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    ids = python_text(tokenizer, args.tokens).ids
    windows = [ids[i : i + args.context] for i in range(0, len(ids) - 1, args.context)]
    result = {"model": str(source), "tokens": len(ids), "context": args.context, "variants": {}}
    reference = measure(source, windows)
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("checkpoint", "q8_0", "q4_0"):
            if name == "checkpoint":
                rows = reference
            else:
                rows = measure(requantized(source, name, Path(scratch) / name), windows)
            result["variants"][name] = {
                "perplexity": round(math.exp(rows[:, 0].mean().item()), 4),
                "top1_agreement": round((rows[:, 1] == reference[:, 1]).float().mean().item(), 4),
            }
    base = result["variants"]["checkpoint"]["perplexity"]
    for entry in result["variants"].values():
        entry["perplexity_delta_pct"] = round(100 * (entry["perplexity"] / base - 1), 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
