"""Peak host memory of each rank while it loads its shard, against its final weights.

Writes a wide Llama checkpoint (bfloat16, 64 narrow layers, about 1.5 GB,
sharded like a release; engine/devtools/testing/wide_checkpoint.py) unless given
one, then loads it with tensor parallelism 1 and 2 (gloo ranks on this
CPU). Each rank samples its own memory every 2 ms from /proc/self/status
while `load_model` runs: anonymous memory (what the process allocated) and
the whole resident set (which also counts the pages of the memory-mapped
safetensors files it read, reclaimable page cache). Both are reported as
the rise over the rank's memory before loading, divided by the bytes of the
weights it ends with.

    python bench/tp_load_memory.py [--dir CHECKPOINT] [--tp 1 2] [--dtype bfloat16]

Prints JSON: per TP size, per rank, weight bytes, peak rises and their ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.devtools.testing.parallel_runs import run_on_ranks  # noqa: E402


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class PeakSampler:
    """Samples RssAnon and VmRSS in a thread until stopped; keeps the maxima."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s = interval_s
        self.peak = {"RssAnon": 0, "VmRSS": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for field in self.peak:
                self.peak[field] = max(self.peak[field], _status_kib(field))
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for field in self.peak:  # the last moment too
            self.peak[field] = max(self.peak[field], _status_kib(field))


def measure_rank(rank: int, model_dir: str, dtype_name: str) -> list[dict]:
    from engine.collectives import parallel
    from engine.models.loader import load_model

    dtype = getattr(torch, dtype_name)
    before = {field: _status_kib(field) for field in ("RssAnon", "VmRSS")}
    started = time.perf_counter()
    with PeakSampler() as sampler:
        model, _, _ = load_model(Path(model_dir), dtype, torch.device("cpu"))
    seconds = time.perf_counter() - started
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    weights = sum(unique.values())
    rises = {field: (sampler.peak[field] - before[field]) * 1024 for field in before}
    mine = {
        "rank": rank,
        "weight_bytes": weights,
        "peak_anon_rise_bytes": rises["RssAnon"],
        "peak_rss_rise_bytes": rises["VmRSS"],
        "anon_ratio": round(rises["RssAnon"] / weights, 3),
        "rss_ratio": round(rises["VmRSS"] / weights, 3),
        "load_seconds": round(seconds, 2),
    }
    # Rank 0 reports for everyone: gather the small dicts over the process group.
    everyone = [None] * parallel.tp_size()
    if parallel.tp_size() > 1:
        torch.distributed.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    return everyone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", help="a checkpoint folder (default: write the wide Llama)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.dir
        if model_dir is None:
            from engine.devtools.testing.wide_checkpoint import write_wide_llama

            model_dir = str(write_wide_llama(Path(scratch) / "wide"))
        files = list(Path(model_dir).glob("*.safetensors"))
        result = {
            "checkpoint_bytes": sum(f.stat().st_size for f in files),
            "files": len(files),
            "dtype": args.dtype,
            "tp": {},
        }
        for tp in args.tp:
            result["tp"][tp] = run_on_ranks(tp, "__main__:measure_rank", model_dir, args.dtype)
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
