"""FP8 KV accuracy against BF16 KV (perplexity, top-1 agreement); prints JSON.

Same as `resident bench accuracy --json`; the first argument names the model
(default smollm2-135m-instruct; `tiny:glm4_moe` or `tiny:kimi_k2` build tiny
random checkpoints).
"""

import json
import sys

from engine.devtools.benchmarks.accuracy import run_accuracy

if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct"
    print(json.dumps(run_accuracy(model), indent=2))
