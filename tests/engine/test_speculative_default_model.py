"""Prompt lookup on the real default model, on the engine's default (fast) path:
BF16 weights, FP8 KV, the CPU kernels. Verification as one-query rows does each
row's arithmetic as plain decoding does, so outputs are identical here too, and
a copying task has its drafts accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from engine.model_files.store import default_model_dir, is_complete

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


def test_constrained_requests_speculate_with_the_same_output():
    """The agent's local requests always carry a grammar (a tool-call structural tag):
    drafts are cut to what it allows and each verification row gets its own mask."""
    from engine.grammar import StructuredOutput

    llm = LLM("smollm2-135m-instruct", page_size=8)
    read = {
        "type": "function",
        "function": {
            "name": "read",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "pattern": "^[a-z_./]{1,40}$"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    }
    call = (
        '<tool_call>\n{"name": "read", "arguments": {"path": "engine/kv/pages.py"}}\n</tool_call>'
    )
    ask = f"Reply with exactly this line and nothing else:\n{call}\n{call}"
    ids = llm.render_chat([{"role": "user", "content": ask}]).token_ids
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0))  # FP8 scales set
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "maxLength": 30}, "lines": {"type": "integer"}},
        "required": ["path", "lines"],
        "additionalProperties": False,
    }
    json_ask = 'Repeat this JSON exactly: {"path": "engine/kv/pages.py", "lines": 54}'
    json_ids = llm.render_chat([{"role": "user", "content": json_ask}]).token_ids
    cases = [
        (ids, StructuredOutput.for_tool_calls("hermes", [read], required=False)),
        (json_ids, StructuredOutput.for_json_schema(schema)),
    ]
    for prompt, structured in cases:

        def run(flag, prompt=prompt, structured=structured):
            params = SamplingParams(
                max_tokens=48, temperature=0, structured=structured, speculative=flag
            )
            return llm.generate([prompt], params)[0].outputs[0].token_ids

        accepted = llm.engine.speculator.stats()["speculative_accepted_tokens"]
        plain = run(False)
        assert run(True) == plain
        assert llm.engine.speculator.stats()["speculative_accepted_tokens"] > accepted
