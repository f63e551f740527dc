"""The HTTP client's stream decoding, errors and retries, without a real model."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from agent.core.clients import (
    BadResponseError,
    ChatRequest,
    Completion,
    ConfigurationError,
    ContentDelta,
    ContextOverflowError,
    HTTPClient,
    ReasoningDelta,
    RetryPolicy,
    ToolCall,
    TransientError,
)
from agent.core.clients.http import api_root
from agent.core.clients.sse import ChatStreamDecoder
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer

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
    assert items[:2] == [ReasoningDelta("hmm"), ContentDelta("Hi")]
    assert items[2:4] == [
        ToolCall("a", "read", '{"path": "x"}'),
        ToolCall("b", "list", "{}"),
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


@pytest.mark.parametrize("error", [httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError])
def test_a_connection_the_server_closed_is_tried_again(error):
    """A pooled keep-alive connection closed by the server during a long tool call fails
    before any answer (seen in CI as a ReadError): the request goes out once more."""
    attempts = []

    def handler(request):
        attempts.append(request)
        if len(attempts) == 1:
            raise error("connection reset by peer")
        return httpx.Response(200, json=ANSWER)

    items = asyncio.run(collect(mock_client(handler, model="m")))
    assert len(attempts) == 2 and items[0] == ContentDelta("whole")


ANSWER = {
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}


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
    assert items[0] == ContentDelta("whole")
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


# GET /v1/models as vLLM answers it (SGLang's entries carry the same max_model_len).
VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "Qwen/Qwen2.5-7B-Instruct",
            "object": "model",
            "created": 1760000000,
            "owned_by": "vllm",
            "root": "Qwen/Qwen2.5-7B-Instruct",
            "parent": None,
            "max_model_len": 32768,
            "permission": [{"id": "modelperm-1", "object": "model_permission"}],
        },
        {
            "id": "sql-lora",
            "object": "model",
            "created": 1760000000,
            "owned_by": "vllm",
            "root": "/adapters/sql-lora",
            "parent": "Qwen/Qwen2.5-7B-Instruct",
            "max_model_len": 16384,
        },
    ],
}


def vllm_handler(paths: list[str]):
    def handler(request):
        paths.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=VLLM_MODELS)
        return httpx.Response(404, json={"detail": "Not Found"})  # no /v1/engine/stats

    return handler


def test_window_from_max_model_len_when_the_server_has_no_stats():
    async def scenario(**kwargs):
        paths: list[str] = []
        client = mock_client(vllm_handler(paths), **kwargs)
        model = await client.resolve_model()
        return model, await client.context_window(), paths

    model, window, paths = asyncio.run(scenario())
    assert (model, window) == ("Qwen/Qwen2.5-7B-Instruct", 32768)
    assert paths.count("/v1/models") == 1  # the listing is asked for once
    # The entry of the model asked for counts; the flag may narrow it, never widen it.
    assert asyncio.run(scenario(model="sql-lora"))[1] == 16384
    assert asyncio.run(scenario(context_window=4096))[1] == 4096
    assert asyncio.run(scenario(context_window=100_000))[1] == 32768


def test_headless_run_attached_to_a_vllm_shaped_server_needs_no_window_flag(repo):
    class VLLMShapedServer(ScriptedServer):
        def _handler(self):
            class Handler(super()._handler()):
                def do_GET(self):
                    if self.path == "/v1/models":
                        self._json(200, VLLM_MODELS)
                    else:
                        super().do_GET()  # /v1/engine/stats: 404, as vLLM

            return Handler

    with VLLMShapedServer([Reply("Hello from vLLM.")], publish_stats=False) as server:
        result = run_cli("hi", *attached(server.url))
        body = server.requests[0]
    assert result.exit_code == 0, result.stderr
    assert result.of_type("session_started")[0]["context_window"] == 32768
    assert "Hello from vLLM." in result.final["final_message"]
    assert body["model"] == "Qwen/Qwen2.5-7B-Instruct"


def test_unknown_window_names_the_flag():
    client = mock_client(lambda request: httpx.Response(404), model="m")
    with pytest.raises(ConfigurationError, match="--context-window"):
        asyncio.run(client.context_window())


def test_a_server_without_a_tool_parser_is_a_configuration_error():
    """vLLM's answer (0.32, started without --enable-auto-tool-choice) to a request with tools."""
    said = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    body = {"error": {"message": said, "type": "BadRequestError", "code": 400}}
    client = mock_client(lambda request: httpx.Response(400, json=body), model="m")
    with pytest.raises(ConfigurationError, match="--enable-auto-tool-choice --tool-call-parser"):
        asyncio.run(collect(client))
