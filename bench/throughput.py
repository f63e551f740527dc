"""Decode throughput, engine against transformers; prints JSON. Same as `resident bench throughput --json`."""

import json
import sys

from engine.devtools.benchmarks.throughput import run_throughput

if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
    print(json.dumps(run_throughput(model), indent=2))
