"""The chat and completion response builders over HTTP, against a scripted engine.

The engine's text is scripted (tests/e2e/scripted_engine.py), so these tests
pin down what the server makes of it: tool calls (complete and streamed),
reasoning, finish reasons, usage, logprobs, cache salts, and errors raised
before or after the stream started, all through the official openai client.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine.server.auth import cache_salt, key_salt
from tests.e2e.conftest import client_for
from tests.e2e.fixtures import API_KEY, SEARCH_TOOL, WEATHER_TOOL
from tests.e2e.scripted_engine import Script

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO_CALLS = (
    "Checking both."
    + CALL_TEXT
    + '<tool_call>{"name": "web.search-v2", "arguments": {"q": "rain \\"today\\""}}</tool_call>'
)
USER = [{"role": "user", "content": "Weather in Paris?"}]


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def collect_stream(stream):
    """Fold streamed chunks: (content, reasoning, {index: [id, name, arguments]}, finish, chunks)."""
    content, reasoning, calls, finish, chunks = "", "", {}, None, []
    for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, [None, None, ""])
                if call.id:
                    assert entry[0] is None, "a call's id and name come once, first"
                    entry[0], entry[1] = call.id, call.function.name
                else:
                    assert entry[0] is not None, "arguments arrived before the call's name"
                entry[2] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, reasoning, calls, finish, chunks


def test_complete_tool_call(scripted):
    scripted.engine.push(Script(pieces("Let me check." + CALL_TEXT)))
    reply = client_for(scripted).chat.completions.create(
        model="scripted-model", messages=USER, tools=[WEATHER_TOOL]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The template rendered the tool, and the parser needed its markers kept.
    submitted = scripted.engine.submitted[0]
    assert submitted.params.skip_special_tokens is False


@pytest.mark.parametrize("size", [1, 4, 200])
def test_streamed_tool_calls_name_first_then_arguments(scripted, size):
    scripted.engine.push(Script(pieces(TWO_CALLS, size)))
    stream = client_for(scripted).chat.completions.create(
        model="scripted-model", messages=USER, tools=[WEATHER_TOOL, SEARCH_TOOL], stream=True
    )
    content, _, calls, finish, chunks = collect_stream(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert content == "Checking both."
    assert finish == "tool_calls"
    assert [calls[i][1] for i in sorted(calls)] == ["get_weather", "web.search-v2"]
    assert json.loads(calls[0][2]) == {"city": "Paris"}
    assert json.loads(calls[1][2]) == {"q": 'rain "today"'}


def test_parallel_tool_calls_false_keeps_the_first(scripted):
    scripted.engine.push(Script(pieces(TWO_CALLS)), Script(pieces(TWO_CALLS)))
    client = client_for(scripted)
    kwargs = dict(model="scripted", messages=USER, tools=[WEATHER_TOOL, SEARCH_TOOL])
    reply = client.chat.completions.create(parallel_tool_calls=False, **kwargs)
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_weather"]
    _, _, calls, _, _ = collect_stream(
        client.chat.completions.create(parallel_tool_calls=False, stream=True, **kwargs)
    )
    assert list(calls) == [0]


def test_malformed_call_is_content_not_a_call_and_a_stream_ends_it(scripted):
    bad = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    scripted.engine.push(Script(pieces(bad)), Script(pieces(bad)))
    client = client_for(scripted)
    reply = client.chat.completions.create(model="scripted", messages=USER, tools=[WEATHER_TOOL])
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"
    assert "<tool_call>" in reply.choices[0].message.content
    content, _, calls, finish, _ = collect_stream(
        client.chat.completions.create(
            model="scripted", messages=USER, tools=[WEATHER_TOOL], stream=True
        )
    )
    # The stream announced the call before it broke and cannot retract it: it ends
    # at its last valid character and does not count (finish_reason "stop");
    # the text follows as content, as in the complete answer.
    assert finish == "stop"
    assert content == reply.choices[0].message.content
    (announced,) = calls.values()
    assert announced[1] == "get_weather" and announced[2] == '{"city": '


def test_tool_call_arguments_stream_as_they_are_written(scripted):
    scripted.engine.push(Script(pieces(CALL_TEXT)))
    stream = client_for(scripted).chat.completions.create(
        model="scripted", messages=USER, tools=[WEATHER_TOOL], stream=True
    )
    pieces_seen = [
        call.function.arguments
        for chunk in stream
        for choice in chunk.choices
        for call in choice.delta.tool_calls or []
        if call.function.arguments
    ]
    assert len(pieces_seen) > 1, "the arguments came in one piece"
    assert json.loads("".join(pieces_seen)) == {"city": "Paris"}


def test_tool_choice_none_drops_tools_and_parsing(scripted, hermes_tok):
    scripted.engine.push(Script(pieces(CALL_TEXT)))
    reply = client_for(scripted).chat.completions.create(
        model="scripted", messages=USER, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == CALL_TEXT
    prompt = hermes_tok.decode(scripted.engine.submitted[0].prompt)
    assert "get_weather" not in prompt and "<tools>" not in prompt


def test_named_tool_choice_offers_only_that_tool(scripted, hermes_tok):
    scripted.engine.push(Script(pieces(CALL_TEXT)))
    reply = client_for(scripted).chat.completions.create(
        model="scripted",
        messages=USER,
        tools=[WEATHER_TOOL, SEARCH_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    prompt = hermes_tok.decode(scripted.engine.submitted[0].prompt)
    assert "get_weather" in prompt and "web.search-v2" not in prompt


def test_tool_history_round_trip_renders(scripted, hermes_tok):
    messages = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
    ]
    reply = client_for(scripted).chat.completions.create(
        model="scripted", messages=messages, tools=[WEATHER_TOOL]
    )
    assert reply.choices[0].message.content == "Hello there."
    prompt = hermes_tok.decode(scripted.engine.submitted[0].prompt)
    # The arguments string was given to the template as an object (no double encoding).
    assert '"arguments": {"city": "Paris"}' in prompt
    assert "<tool_response>\n18C and sunny\n</tool_response>" in prompt


def test_special_tokens_other_than_markers_never_reach_content(scripted):
    scripted.engine.push(Script(["Hi", "<|im_start|>", " you", "<|endoftext|>"]))
    reply = client_for(scripted).chat.completions.create(
        model="scripted", messages=USER, tools=[WEATHER_TOOL]
    )
    assert reply.choices[0].message.content == "Hi you"


def test_usage_reports_cached_tokens_and_stream_usage(scripted):
    scripted.engine.push(Script(["a", "b"], cached_tokens=16), Script(["a", "b"], cached_tokens=16))
    client = client_for(scripted)
    reply = client.chat.completions.create(model="scripted", messages=USER)
    prompt_tokens = len(scripted.engine.submitted[0].prompt)
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.usage.completion_tokens == 2
    assert reply.usage.prompt_tokens_details.cached_tokens == 16
    chunks = list(
        client.chat.completions.create(
            model="scripted",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 16
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_reasoning_content_split_off(tmp_path, hermes_tok):
    from engine.server.app import create_app
    from engine.server.background import BackgroundServer
    from tests.e2e.fixtures import THINKING_TEMPLATE, served
    from tests.e2e.scripted_engine import ScriptedEngine

    # The template opened <think>, so the output starts inside the reasoning.
    text = "The user wants weather.\n</think>\n\nIt is sunny." + CALL_TEXT
    engine = ScriptedEngine(default=Script(pieces(text, 2)))
    app = create_app(engine, served(hermes_tok, template=THINKING_TEMPLATE))
    with BackgroundServer(app) as server:
        client = client_for(server, api_key=None)
        reply = client.chat.completions.create(
            model="scripted", messages=USER, tools=[WEATHER_TOOL]
        )
        message = reply.choices[0].message
        assert message.reasoning_content == "The user wants weather."
        assert message.content == "It is sunny."
        assert message.tool_calls[0].function.name == "get_weather"
        content, reasoning, calls, finish, _ = collect_stream(
            client.chat.completions.create(
                model="scripted", messages=USER, tools=[WEATHER_TOOL], stream=True
            )
        )
        assert (content, reasoning) == ("It is sunny.", "The user wants weather.")
        assert calls[0][1] == "get_weather" and finish == "tool_calls"


def test_n_choices_and_logprobs(scripted):
    client = client_for(scripted)
    reply = client.chat.completions.create(
        model="scripted", messages=USER, n=2, seed=7, logprobs=True, top_logprobs=2
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert [s.params.seed for s in scripted.engine.submitted] == [7, 8]
    content = reply.choices[0].logprobs.content
    assert len(content) == 3 and content[0].logprob == -0.5
    assert len(content[0].top_logprobs) == 2
    assert reply.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(model="scripted", messages=USER, n=2, stream=True))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: "Hello there.", 1: "Hello there."}


def test_cache_salt_is_per_key_unless_the_request_names_one(scripted):
    client = client_for(scripted)
    client.chat.completions.create(model="scripted", messages=USER)
    client.chat.completions.create(model="scripted", messages=USER, extra_body={"cache_salt": "t1"})
    salts = [s.cache_salt for s in scripted.engine.submitted]
    assert salts == [key_salt(API_KEY), cache_salt(API_KEY, "t1")]
    assert API_KEY not in salts[0] and salts[0] != salts[1]


def test_overloaded_is_503_with_retry_after(scripted):
    scripted.engine.push(Script([], overloaded=True), Script([], overloaded=True))
    with pytest.raises(openai.InternalServerError) as caught:
        client_for(scripted).chat.completions.create(model="scripted", messages=USER)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["retry-after"] == "1"
    response = httpx.post(
        scripted.url + "/v1/completions",
        json={"prompt": "hi", "stream": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "overloaded"


def test_engine_error_mid_stream_reaches_the_client(scripted):
    message = "the request needs 9 KV pages but only 2 of 8 can be freed"
    scripted.engine.push(Script(["a", "b"], error=message), Script(["a"], error=message))
    client = client_for(scripted)
    with pytest.raises(openai.APIError, match="KV pages"):
        list(client.chat.completions.create(model="scripted", messages=USER, stream=True))
    with pytest.raises(openai.InternalServerError, match="KV pages"):
        client.chat.completions.create(model="scripted", messages=USER)


def test_completions_stream_and_list_of_prompts(scripted):
    client = client_for(scripted)
    reply = client.completions.create(model="scripted", prompt=["one", "two"], n=2, max_tokens=5)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.text == "Hello there." for c in reply.choices)
    assert reply.usage.prompt_tokens == sum(len(s.prompt) for s in scripted.engine.submitted[::2])
    chunks = list(
        client.completions.create(
            model="scripted",
            prompt="one",
            echo=True,
            stream=True,
            max_tokens=5,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "oneHello there."
    assert chunks[-1].usage.completion_tokens == 3


def test_raw_sse_framing(scripted):
    response = httpx.post(
        scripted.url + "/v1/chat/completions",
        json={"model": "scripted", "messages": USER, "stream": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: {")
        json.loads(event[len("data: ") :])


def test_client_disconnect_aborts_the_request(scripted):
    import time

    scripted.engine.push(Script(["x"] * 500, delay=0.01))
    with httpx.stream(
        "POST",
        scripted.url + "/v1/chat/completions",
        json={"model": "scripted", "messages": USER, "stream": True},
        headers={"Authorization": f"Bearer {API_KEY}"},
    ) as response:
        lines = response.iter_lines()
        for _ in range(4):
            next(lines)
        assert scripted.engine.active
    deadline = time.monotonic() + 30
    while scripted.engine.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scripted.engine.active
