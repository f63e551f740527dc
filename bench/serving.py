"""Serving benchmarks; prints JSON. `resident bench prefix --json` runs the first.

python bench/serving.py prefix        # TTFT with a shared 6k-token prefix vs cold
python bench/serving.py concurrency   # 32 concurrent clients vs transformers one by one
python bench/serving.py kv-budget     # one KV budget: N sequences in BF16, 2N in FP8
python bench/serving.py all
"""

import json
import sys

from engine.devtools.benchmarks.kv_budget import run_kv_budget
from engine.devtools.benchmarks.serving import run_concurrency, run_prefix

BENCHMARKS = {"prefix": run_prefix, "concurrency": run_concurrency, "kv-budget": run_kv_budget}

if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which != "all" and which not in BENCHMARKS:
        sys.exit(f"usage: python bench/serving.py [{'|'.join(BENCHMARKS)}|all]")
    names = list(BENCHMARKS) if which == "all" else [which]
    for name in names:
        print(json.dumps(BENCHMARKS[name](), indent=2), flush=True)
