"""LocalClient over the in-process engine: rendering, text tool calls, pinning, a real run."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.core.clients import ChatRequest, Completion, ContentDelta, ToolCall
from agent.core.clients.local import LocalClient
from engine.requests.outputs import CompletionOutput, RequestOutput
from tests.agent.helpers import run_cli
from tests.engine.checkpoints import save_tokenizer, tiny_llama

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


class FakeEngine:
    """The AsyncEngine surface LocalClient uses, answering with scripted text."""

    def __init__(self, tokenizer, answer: list[str]) -> None:
        self.tokenizer = tokenizer
        self.answer = answer
        self.prompts: list[list[int]] = []
        self.pins: list[list[int]] = []
        self.engine = SimpleNamespace(model_dir=None)

    async def pin_prefix(self, token_ids, cache_salt=""):
        self.pins.append(list(token_ids))
        return ["handle"]

    async def unpin_prefix(self, handle):
        return None

    async def stats(self):
        return {"max_context_tokens": 4096, "capacity_tokens": 100_000}

    async def call(self, fn):
        return fn()

    async def generate(self, prompt, params, request_id, cache_salt=""):
        self.prompts.append(list(prompt))
        text = ""
        for position, piece in enumerate(self.answer):
            text += piece
            last = position == len(self.answer) - 1
            yield RequestOutput(
                request_id=request_id,
                prompt=None,
                prompt_token_ids=list(prompt),
                outputs=[
                    CompletionOutput(
                        index=0,
                        text=text,
                        token_ids=list(range(position + 1)),
                        finish_reason="stop" if last else None,
                        delta_text=piece,
                    )
                ],
                finished=last,
                num_cached_tokens=7,
            )


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"), 320)


async def collect(client, request):
    return [item async for item in client.stream(request)]


def test_text_tool_calls_are_parsed(tokenizer):
    answer = [
        "Let me ",
        "look.<tool_",
        'call>\n{"name": "read", ',
        '"arguments": {"path": "a.py"}}\n</tool_call>',
    ]
    engine = FakeEngine(tokenizer, answer)
    client = LocalClient(engine, "fake")
    messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "read a.py"},
    ]
    items = asyncio.run(collect(client, ChatRequest(messages, TOOLS, pinned_messages=1)))
    text = "".join(i.text for i in items if isinstance(i, ContentDelta))
    assert text == "Let me look."
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert [(c.name, c.arguments_json) for c in calls] == [("read", '{"path": "a.py"}')]
    completion = items[-1]
    assert isinstance(completion, Completion) and completion.usage.cached_tokens == 7
    prompt = tokenizer.decode(engine.prompts[0])
    assert "<tools>" in prompt and '"name": "read"' in prompt  # the text tool format
    # The pinned prefix is the system message, a prefix of the prompt.
    pinned = engine.pins[0]
    assert engine.prompts[0][: len(pinned)] == pinned
    assert "read a.py" not in tokenizer.decode(pinned)


def test_history_with_tool_traffic_renders_as_text(tokenizer):
    engine = FakeEngine(tokenizer, ["ok"])
    client = LocalClient(engine, "fake")
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read", "arguments": '{"path": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "file body"},
    ]
    asyncio.run(collect(client, ChatRequest(messages, TOOLS)))
    prompt = tokenizer.decode(engine.prompts[0])
    assert '<tool_call>\n{"name": "read", "arguments": {"path": "x"}}\n</tool_call>' in prompt
    assert "<tool_response>\nfile body\n</tool_response>" in prompt


def test_tiny_engine_caches_and_pins_the_prefix(tmp_path):
    model = tiny_llama(tmp_path / "m", max_position_embeddings=1024)
    client = LocalClient.start(str(model), kv_cache_dtype="auto", dtype="float32")

    async def scenario():
        system = {"role": "system", "content": "resident " * 60}
        first = [system, {"role": "user", "content": "one"}]
        a = await collect(client, ChatRequest(first, max_tokens=3, pinned_messages=1))
        second = [*first, {"role": "assistant", "content": "x"}, {"role": "user", "content": "two"}]
        b = await collect(client, ChatRequest(second, max_tokens=3, pinned_messages=1))
        pinned = client._pin_handle
        pins = [node.pins for node in pinned]
        await client.aclose()
        return a[-1], b[-1], pins, [node.pins for node in pinned]

    first, second, pins, after_close = asyncio.run(scenario())
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens >= 48  # the system message came from the cache
    assert pins and set(pins) == {1}  # the resident prefix is pinned once
    assert set(after_close) == {0}


def test_a_second_session_restores_the_resident_prefix_from_disk(tmp_path):
    """Session one saves its resident prefix's KV (FP8 bytes and scales); session two,
    a new engine on the same model, restores it before its first request."""
    model = tiny_llama(tmp_path / "m", max_position_embeddings=1024)
    system = {"role": "system", "content": "resident " * 60}
    request = ChatRequest(
        [system, {"role": "user", "content": "one"}], max_tokens=3, pinned_messages=1
    )

    async def session():
        client = LocalClient.start(str(model), dtype="float32")
        items = await collect(client, request)
        text = "".join(i.text for i in items if isinstance(i, ContentDelta))
        await client.aclose()
        return items[-1].usage.cached_tokens, text

    cold, cold_text = asyncio.run(session())
    warm, warm_text = asyncio.run(session())
    assert cold == 0
    assert warm >= 48  # the system message's full pages came from the disk tier
    assert warm_text == cold_text


def _default_model_present() -> bool:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(cache) / "resident/models/smollm2-135m-instruct/config.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not _default_model_present(), reason="run `resident models pull` first")
def test_headless_run_on_the_default_model(tmp_path, monkeypatch):
    """The whole local path: engine, template, text tool format, events. SmolLM2 cannot do
    the task; the run must still be well-formed. Few tools and tokens keep the CPU prefill short."""
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    monkeypatch.chdir(tmp_path)
    result = run_cli(
        "What does calc.py define?",
        "--json",
        "--tools",
        "read",
        "--approval",
        "read-only",
        "--max-tokens",
        "8",
        "--max-turns",
        "2",
    )
    types = result.types()
    assert types[:3] == ["session_started", "context_snapshot", "user_message"], result.stderr
    assert result.of_type("context_snapshot")[0]["token_count"] == "tokenizer"
    assert result.of_type("session_started")[0]["context_window"] == 8192
    usage = result.of_type("usage")[0]
    assert usage["prompt_tokens"] > usage["resident_tokens"] > 0
    assert usage["cached_tokens"] is not None
    assert result.final["exit_code"] == result.exit_code
    assert result.exit_code in (0, 1)  # 1 only when it kept calling tools past --max-turns
    assert [e["seq"] for e in result.events] == list(range(1, len(result.events) + 1))
