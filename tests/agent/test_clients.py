"""The HTTP client's stream decoding, errors and retries, without a real model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agent.clients import (
    BadResponseError,
    ChatRequest,
    Completion,
    ConfigurationError,
    ContextOverflowError,
    HTTPClient,
    ReasoningChunk,
    RetryPolicy,
    TextChunk,
    ToolCallChunk,
    TransientError,
)
from agent.clients.http import api_root
from agent.clients.sse import ChatStreamDecoder

FAST = RetryPolicy(attempts=3, base_delay_s=0.0)


def sse(*chunks) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def feed(text: str):
    decoder = ChatStreamDecoder()
    items = []
    for line in text.splitlines():
        items += decoder.feed_line(line)
    return items + decoder.finish()


def test_decoder_assembles_tool_calls_reasoning_and_usage():
    text = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "hmm"}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "read", "arguments": ""}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 1, "id": "b", "function": {"name": "list", "arguments": "{}"}}
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        },
    )
    items = feed(": comment\n" + text)
    assert items[:2] == [ReasoningChunk("hmm"), TextChunk("Hi")]
    assert items[2:4] == [
        ToolCallChunk("a", "read", '{"path": "x"}'),
        ToolCallChunk("b", "list", "{}"),
    ]
    completion = items[4]
    assert completion.finish_reason == "tool_calls" and completion.usage.cached_tokens == 8


def test_decoder_rejects_garbage_and_cut_streams():
    with pytest.raises(BadResponseError):
        feed("data: {not json\n")
    cut = 'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "read", "arguments": "{"}}]}}]}\n'
    with pytest.raises(TransientError, match="middle of a tool call"):
        feed(cut)
    with pytest.raises(ContextOverflowError):
        feed('data: {"error": {"message": "maximum context length exceeded"}}\n')


def test_api_root_accepts_common_spellings():
    assert api_root("localhost:8000") == "http://localhost:8000"
    assert api_root("http://h:1/v1/") == "http://h:1"


def mock_client(handler, **kwargs) -> HTTPClient:
    return HTTPClient("http://test", transport=httpx.MockTransport(handler), retry=FAST, **kwargs)


async def collect(client):
    request = ChatRequest([{"role": "user", "content": "hi"}])
    return [item async for item in client.stream(request)]


def test_retries_connection_errors_then_gives_up():
    attempts = []

    def handler(request):
        attempts.append(request)
        raise httpx.ConnectError("refused")

    client = mock_client(handler, model="m")
    with pytest.raises(TransientError, match="gave up after 3 attempts"):
        asyncio.run(collect(client))
    assert len(attempts) == 3


def test_a_non_streaming_answer_is_accepted():
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "whole"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    client = mock_client(lambda request: httpx.Response(200, json=body), model="m")
    items = asyncio.run(collect(client))
    assert items[0] == TextChunk("whole")
    assert isinstance(items[-1], Completion) and items[-1].usage.cached_tokens is None


def test_model_and_window_come_from_the_server():
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served"}]})
        if request.url.path == "/v1/engine/stats":
            return httpx.Response(200, json={"max_context_tokens": 9000, "capacity_tokens": 5000})
        return httpx.Response(404)

    async def scenario():
        client = mock_client(handler, context_window=7000)
        return await client.resolve_model(), await client.context_window()

    # The server's capacity bounds it; the flag may narrow, never widen.
    assert asyncio.run(scenario()) == ("served", 5000)


def test_unknown_window_names_the_flag():
    client = mock_client(lambda request: httpx.Response(404), model="m")
    with pytest.raises(ConfigurationError, match="--context-window"):
        asyncio.run(client.context_window())


def test_only_the_client_package_imports_the_engine():
    """DESIGN.md §1: the agent reaches the engine through one client module."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "agent"
    allowed = {"clients", "cli"}  # the CLI also hosts the engine commands (serve, models, bench)
    offenders = []
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "engine"]
    assert offenders == []
