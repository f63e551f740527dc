"""The agent's local client asks the engine to constrain the tool calls its model starts."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from agent.core.clients import ChatRequest
from agent.core.clients.local import LocalClient
from agent.core.clients.structured import tool_call_constraint
from tests.agent.test_local_client import TOOLS, FakeEngine, collect
from tests.engine.checkpoints import save_tokenizer

MESSAGES = [{"role": "user", "content": "read a.py"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"), 320)


class RecordingEngine(FakeEngine):
    def __init__(self, tokenizer, answer):
        super().__init__(tokenizer, answer)
        self.params = []

    async def generate(self, prompt, params, request_id, cache_salt=""):
        self.params.append(params)
        async for output in super().generate(prompt, params, request_id, cache_salt):
            yield output


def test_calls_the_model_opens_are_constrained_text_stays_free(tokenizer):
    engine = RecordingEngine(tokenizer, ["ok"])
    client = LocalClient(engine, "fake")
    asyncio.run(collect(client, ChatRequest(MESSAGES, TOOLS)))
    asyncio.run(collect(client, ChatRequest(MESSAGES, [])))
    with_tools, without = engine.params
    calls = with_tools.structured.tool_calls
    assert calls.format == "hermes" and not calls.required  # free text until <tool_call>
    assert [tool.name for tool in calls.tools] == ["read"]
    assert without.structured is None


def test_a_schema_the_grammar_cannot_enforce_leaves_calls_free(caplog):
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object", "not": {"required": ["a"]}}},
        }
    ]
    prompt = SimpleNamespace(tool_parser="hermes", tools=tools)
    with caplog.at_level(logging.WARNING):
        assert tool_call_constraint(prompt) is None
    assert "not is not supported" in caplog.text
    assert tool_call_constraint(SimpleNamespace(tool_parser=None, tools=tools)) is None
