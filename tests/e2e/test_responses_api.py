"""The OpenAI Responses API (/v1/responses) through the official openai SDK.

Mostly against the scripted engine (tests/e2e/scripted_engine.py), whose
output is scripted so that tool calls and reasoning can be pinned down;
the prefix-cache test runs on the tiny real checkpoint, where a repeated
prompt is really served from the cache.
"""

from __future__ import annotations

import dataclasses
import json
import time

import httpx
import openai
import pytest

from engine.server.app import create_app
from engine.server.background import BackgroundServer
from engine.server.responses_input import chat_messages
from engine.server.responses_protocol import decode_reasoning, encode_reasoning
from tests.e2e.conftest import client_for
from tests.e2e.fixtures import API_KEY, THINKING_TEMPLATE, served
from tests.e2e.scripted_engine import Script, ScriptedEngine

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SEARCH_CALL = '<tool_call>{"name": "web.search-v2", "arguments": {"q": "rain"}}</tool_call>'
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "parameters": CITY, "strict": True}
SEARCH = {"type": "function", "name": "web.search-v2", "parameters": {"type": "object"}}
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def prompt_text(server, tokenizer, which: int = -1) -> str:
    return tokenizer.decode(server.engine.submitted[which].prompt)


@pytest.fixture(scope="module")
def thinking_server(hermes_tok):
    """A scripted server whose template opens <think>, so output starts inside reasoning."""
    engine = ScriptedEngine()
    app = create_app(engine, served(hermes_tok, template=THINKING_TEMPLATE))
    with BackgroundServer(app) as server:
        server.engine = engine
        yield server


def test_text_response_and_usage(scripted, hermes_tok):
    scripted.engine.push(Script(["Hello", " there", "."], cached_tokens=16))
    client = client_for(scripted)
    reply = client.responses.create(
        model="scripted-model", input="Weather in Paris?", instructions="Be brief.", user="u1"
    )
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.status == "completed" and reply.incomplete_details is None
    assert reply.model == "scripted-model" and reply.output_text == "Hello there."
    (message,) = reply.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    usage = reply.usage
    assert usage.input_tokens == len(scripted.engine.submitted[0].prompt)
    assert usage.input_tokens_details.cached_tokens == 16
    assert usage.output_tokens == 3 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + 3
    prompt = prompt_text(scripted, hermes_tok)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>" in prompt


def test_stream_is_the_semantic_event_sequence(scripted):
    events = list(client_for(scripted).responses.create(model="scripted", input="hi", stream=True))
    expected = "created in_progress output_item.added content_part.added" + (
        " output_text.delta" * 3 + " output_text.done content_part.done output_item.done completed"
    )
    assert [event.type for event in events] == ["response." + name for name in expected.split()]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "Hello there."
    )
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "Hello there."
    assert final.id == events[0].response.id and final.usage.output_tokens == 3


def test_raw_sse_names_each_event_and_has_no_done_marker(scripted):
    response = httpx.post(
        scripted.url + "/v1/responses",
        json={"model": "scripted", "input": "hi", "stream": True},
        headers=AUTH,
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [block for block in response.text.split("\n\n") if block]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: {")
        assert json.loads(data_line[len("data: ") :])["type"] == event_line[len("event: ") :]
    assert blocks[-1].startswith("event: response.completed")


def test_function_call_round_trip(scripted, hermes_tok):
    scripted.engine.push(Script(pieces("Let me check." + CALL_TEXT)))
    client = client_for(scripted)
    first = client.responses.create(model="scripted", input="Weather in Paris?", tools=[WEATHER])
    message, call = first.output
    assert message.type == "message" and first.output_text == "Let me check."
    assert call.type == "function_call" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.tools[0].name == "get_weather" and first.tools[0].strict is True
    # The SDK's own output items go back as input, then the function's result.
    second = client.responses.create(
        model="scripted",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *first.output,
            {"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"},
        ],
        tools=[WEATHER],
    )
    assert second.output_text == "Hello there."
    prompt = prompt_text(scripted, hermes_tok)
    # Text and call are one assistant turn, the arguments an object, the output a tool turn.
    assert '<|im_start|>assistant\nLet me check.<tool_call>\n{"name": "get_weather", ' in prompt
    assert '"arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n18C and sunny\n</tool_response>" in prompt


@pytest.mark.parametrize("size", [1, 200])
def test_streamed_function_calls(scripted, size):
    scripted.engine.push(Script(pieces("Checking." + CALL_TEXT + SEARCH_CALL, size)))
    client = client_for(scripted)
    with client.responses.stream(model="scripted", input="hi", tools=[WEATHER, SEARCH]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [event.type for event in events]
    assert types.count("response.function_call_arguments.done") == 2
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [item.type for item in added] == ["message", "function_call", "function_call"]
    assert added[1].arguments == "" and added[1].status == "in_progress"
    for output_index, arguments in ((1, {"city": "Paris"}), (2, {"q": "rain"})):
        deltas = [
            e.delta
            for e in events
            if e.type == "response.function_call_arguments.delta" and e.output_index == output_index
        ]
        assert json.loads("".join(deltas)) == arguments
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.status for item in done] == ["completed"] * 3
    assert [item.name for item in final.output[1:]] == ["get_weather", "web.search-v2"]
    assert final.output_text == "Checking."


def test_namespaced_tools_and_hosted_tools_as_codex_sends_them(scripted, hermes_tok):
    """Codex groups its sub-agent tools in a namespace and always adds web_search."""
    agents = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "close_agent"}],
    }
    tools = [agents, {"type": "web_search", "external_web_access": False}]
    call = CALL_TEXT.replace("get_weather", "multi_agent_v1.close_agent")
    scripted.engine.push(Script(pieces(call)))
    client = client_for(scripted)
    first = client.responses.create(model="scripted", input="hi", tools=tools)
    (item,) = first.output
    assert (item.name, item.namespace) == ("close_agent", "multi_agent_v1")
    assert [tool.type for tool in first.tools] == ["namespace", "web_search"]
    prompt = prompt_text(scripted, hermes_tok)
    assert '"name": "multi_agent_v1.close_agent"' in prompt and "web_search" not in prompt
    # The call goes back as history with its namespace, and renders as it was offered.
    client.responses.create(
        model="scripted",
        input=[
            {"role": "user", "content": "hi"},
            *first.output,
            {"type": "function_call_output", "call_id": item.call_id, "output": "closed"},
        ],
        tools=tools,
    )
    assert '{"name": "multi_agent_v1.close_agent", "arguments"' in prompt_text(scripted, hermes_tok)
    # A plain function whose name has a dot is not split.
    scripted.engine.push(Script(pieces(SEARCH_CALL)))
    reply = client.responses.create(model="scripted", input="hi", tools=[SEARCH, agents])
    assert (reply.output[0].name, reply.output[0].namespace) == ("web.search-v2", None)


def test_parallel_tool_calls_false_keeps_the_first(scripted):
    scripted.engine.push(Script(pieces(CALL_TEXT + SEARCH_CALL)))
    reply = client_for(scripted).responses.create(
        model="scripted", input="hi", tools=[WEATHER, SEARCH], parallel_tool_calls=False
    )
    assert [item.name for item in reply.output] == ["get_weather"]
    assert reply.parallel_tool_calls is False


def test_tool_choice_maps_onto_chat(scripted, hermes_tok):
    client = client_for(scripted)
    client.responses.create(
        model="scripted",
        input="hi",
        tools=[WEATHER, SEARCH],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    prompt = prompt_text(scripted, hermes_tok)
    assert "get_weather" in prompt and "web.search-v2" not in prompt
    scripted.engine.push(Script(pieces(CALL_TEXT)))
    reply = client.responses.create(
        model="scripted", input="hi", tools=[WEATHER], tool_choice="none"
    )
    assert "<tools>" not in prompt_text(scripted, hermes_tok)
    assert reply.output_text == CALL_TEXT  # not parsed: no tools were offered
    with pytest.raises(openai.BadRequestError, match="no tools"):
        client.responses.create(model="scripted", input="hi", tool_choice="required")


def test_reasoning_items(thinking_server):
    text = "The user wants weather.\n</think>\n\nIt is sunny." + CALL_TEXT
    thinking_server.engine.push(Script(pieces(text, 2)), Script(pieces(text, 2)))
    client = client_for(thinking_server, api_key=None)
    kwargs = dict(model="scripted", input="Weather?", tools=[WEATHER], reasoning={"effort": "low"})
    reply = client.responses.create(**kwargs)
    reasoning, message, call = reply.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content[0].model_dump() == {
        "type": "reasoning_text",
        "text": "The user wants weather.",
    }
    assert reasoning.summary == [] and reasoning.encrypted_content is None
    assert reply.output_text == "It is sunny." and call.name == "get_weather"
    assert reply.reasoning.effort == "low"
    details = reply.usage.output_tokens_details
    assert 0 < details.reasoning_tokens < reply.usage.output_tokens

    events = list(client.responses.create(stream=True, **kwargs))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == "The user wants weather."
    (done,) = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == "The user wants weather." and done.output_index == 0
    parts = [e.part.type for e in events if e.type == "response.content_part.added"]
    assert parts == ["reasoning_text", "output_text"]
    assert events[-1].response.usage.output_tokens_details == details

    # Stateless clients (Codex with store=false) get the reasoning back as an opaque token.
    thinking_server.engine.push(Script(pieces(text, 2)))
    include = ["reasoning.encrypted_content"]
    reply = client.responses.create(store=False, include=include, **kwargs)
    assert decode_reasoning(reply.output[0].encrypted_content) == "The user wants weather."


def test_reasoning_goes_back_to_the_template():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "A"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "B"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": encode_reasoning("C")},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    messages = chat_messages(items, "Be brief.")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assistant = messages[2]
    assert assistant["content"] == "B" and assistant["reasoning_content"] == "A\n\nC"
    assert assistant["tool_calls"][0]["id"] == "c1"


def test_max_output_tokens_makes_an_incomplete_response(scripted):
    script = Script(["one", " two", " three"], finish_reason="length")
    scripted.engine.push(script, script)
    client = client_for(scripted)
    reply = client.responses.create(model="scripted", input="count", max_output_tokens=3)
    assert scripted.engine.submitted[0].params.max_tokens == 3
    assert reply.status == "incomplete"
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output[0].status == "incomplete" and reply.output_text == "one two three"
    events = list(
        client.responses.create(model="scripted", input="count", max_output_tokens=3, stream=True)
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def _comparable(params) -> dict:
    """SamplingParams as values; objects without value equality (a compiled grammar) by type."""
    values = {}
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        plain = value is None or isinstance(value, str | int | float | bool | list | dict | tuple)
        values[field.name] = value if plain else type(value).__name__
    return values


JSON_SCHEMA = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}


@pytest.mark.parametrize("fmt", [{"type": "json_object"}, JSON_SCHEMA])
def test_text_format_is_the_chat_response_format(scripted, fmt):
    """The same request through both APIs: the same outcome, prompt and sampling parameters."""
    response_format = {"type": fmt["type"]}
    if fmt["type"] == "json_schema":
        response_format["json_schema"] = {k: fmt[k] for k in ("name", "schema", "strict")}
    scripted.engine.push(Script(['{"city": "Paris"}']), Script(['{"city": "Paris"}']))
    client = client_for(scripted)
    messages = [{"role": "user", "content": "A city as JSON."}]
    try:
        client.chat.completions.create(
            model="scripted", messages=messages, response_format=response_format
        )
    except openai.BadRequestError:  # the chat pipeline refuses it: so do we, naming our field
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="scripted", input=messages, text={"format": fmt})
        assert caught.value.param == "text.format"
        return
    reply = client.responses.create(model="scripted", input=messages, text={"format": fmt})
    assert reply.text.format.type == fmt["type"]
    assert json.loads(reply.output_text) == {"city": "Paris"}
    by_chat, by_responses = scripted.engine.submitted
    assert by_chat.prompt == by_responses.prompt
    assert _comparable(by_chat.params) == _comparable(by_responses.params)


def test_previous_response_id_chains_and_retrieve(scripted, hermes_tok):
    client = client_for(scripted)
    first = client.responses.create(model="scripted", input="First question", instructions="Hm.")
    second = client.responses.create(
        model="scripted", input="Second question", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    prompt = prompt_text(scripted, hermes_tok)
    assert "Hm." not in prompt  # instructions are not carried over
    assert prompt.index("First question") < prompt.index("Hello there.")
    assert prompt.index("Hello there.") < prompt.index("Second question")
    third = client.responses.create(model="scripted", input="Third", previous_response_id=second.id)
    assert prompt_text(scripted, hermes_tok).count("Hello there.") == 2
    assert client.responses.retrieve(third.id).output_text == "Hello there."
    client.responses.delete(third.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(third.id)
    unstored = client.responses.create(model="scripted", input="hi", store=False)
    with pytest.raises(openai.NotFoundError, match="no response with id"):
        client.responses.create(model="scripted", input="x", previous_response_id=unstored.id)


def test_cached_tokens_on_a_repeated_prefix(tiny_server):
    client = client_for(tiny_server)
    instructions = "You review Python code carefully and answer briefly. " * 6
    kwargs = dict(model="tiny-llama", instructions=instructions, max_output_tokens=2, temperature=0)
    cold = client.responses.create(input="def add(a, b):", **kwargs)
    warm = client.responses.create(input="def sub(a, b):", **kwargs)
    assert cold.usage.input_tokens > 48 and cold.usage.output_tokens <= 2
    assert warm.usage.input_tokens_details.cached_tokens >= 32  # the shared instructions' pages
    assert warm.usage.input_tokens_details.cached_tokens < warm.usage.input_tokens


def assert_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    return error


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0.type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
        ({"input": []}, "input"),
        ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools.0.type"),
        (
            {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
            "tools.0.tools.0.type",
        ),
        ({"tools": [{"type": "namespace", "tools": []}]}, "tools.0.name"),
        ({"tools": [{"type": "function"}]}, "tools.0.name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"background": True}, None),
        ({"input": None}, None),
    ],
)
def test_bad_requests_are_400_in_openai_shape(scripted, fields, param):
    body = {"model": "scripted", "input": "hi", **fields}
    assert_error(httpx.post(scripted.url + "/v1/responses", json=body, headers=AUTH), 400, param)


def test_errors_reach_the_sdk_as_typed_exceptions(scripted):
    client = client_for(scripted)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.responses.create(model="gpt-9", input="hi")
    with pytest.raises(openai.BadRequestError, match="not supported") as caught:
        client.responses.create(
            model="scripted",
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
        )
    assert caught.value.param == "input.0.content.0"
    with pytest.raises(openai.AuthenticationError):
        client_for(scripted, api_key="wrong").responses.create(model="scripted", input="hi")
    scripted.engine.push(Script([], overloaded=True))
    with pytest.raises(openai.InternalServerError) as caught:
        client.responses.create(model="scripted", input="hi")
    assert caught.value.status_code == 503


def test_engine_failure_after_the_start(scripted):
    message = "the request needs 9 KV pages but only 2 of 8 can be freed"
    scripted.engine.push(Script(["a", "b"], error=message), Script(["a"], error=message))
    client = client_for(scripted)
    events = list(client.responses.create(model="scripted", input="hi", stream=True))
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error"
    assert "KV pages" in failed.error.message
    with pytest.raises(openai.InternalServerError, match="KV pages"):
        client.responses.create(model="scripted", input="hi")


def test_client_disconnect_aborts_the_request(scripted):
    scripted.engine.push(Script(["x"] * 500, delay=0.01))
    with httpx.stream(
        "POST",
        scripted.url + "/v1/responses",
        json={"model": "scripted", "input": "hi", "stream": True},
        headers=AUTH,
    ) as response:
        lines = response.iter_lines()
        for _ in range(12):
            next(lines)
        assert scripted.engine.active
    deadline = time.monotonic() + 30
    while scripted.engine.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scripted.engine.active
