"""The engine on a machine without Triton (it is installed only on Linux x86-64): it imports,
loads a model and decodes on the CPU. A module-level import of a Triton kernel module anywhere
on the CPU path (CUDA-graph inputs once were) breaks every command there."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import importlib.abc, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("no triton on this machine")

sys.meta_path.insert(0, NoTriton())
from pathlib import Path
from engine import LLM, SamplingParams
from engine.devtools.testing.checkpoints import tiny_llama

path = tiny_llama(Path(sys.argv[1]) / "llama")
llm = LLM(str(path), dtype="float32", kv_memory=0.01)
out = llm.generate([[5, 17, 42]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
assert "triton" not in sys.modules
print("tokens", len(out[0].outputs[0].token_ids))
"""


def test_the_engine_loads_and_decodes_without_triton(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tokens 3" in done.stdout
