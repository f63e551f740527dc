"""Prompt lookup on the real default model, on the engine's default (fast) path:
BF16 weights, FP8 KV, the CPU kernels. Verification as one-query rows does each
row's arithmetic as plain decoding does, so outputs are identical here too, and
a copying task has its drafts accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.model_store import default_model_dir, is_complete

pytestmark = pytest.mark.skipif(
    not is_complete(default_model_dir()), reason="default model not pulled: resident models pull"
)

SOURCE = (Path(__file__).resolve().parents[2] / "engine" / "kv" / "pages.py").read_text()


def test_copying_task_identical_and_accepted():
    llm = LLM("smollm2-135m-instruct", page_size=8)
    ask = f"```python\n{SOURCE[:1200]}```\nRepeat the code above exactly."
    copy = llm.render_chat([{"role": "user", "content": ask}]).token_ids
    prose = llm.render_chat([{"role": "user", "content": "Name three rivers."}]).token_ids
    llm.generate([copy], SamplingParams(max_tokens=1, temperature=0))  # FP8 scales set
    free = llm.engine.allocator.num_free + llm.engine.prefix_cache.num_pages

    def run(flags):
        params = [SamplingParams(max_tokens=40, temperature=0, speculative=f) for f in flags]
        return [o.outputs[0].token_ids for o in llm.generate([copy, prose], params)]

    plain = run([False, False])
    assert run([True, False]) == plain
    assert run([True, True]) == plain
    stats = llm.engine.speculator.stats()
    assert stats["speculative_accepted_tokens"] > 10
    assert llm.engine.allocator.num_free + llm.engine.prefix_cache.num_pages == free
