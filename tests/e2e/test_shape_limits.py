"""Shape limits at the HTTP edge: nesting, numbers, tool schemas, a too-long prompt (issue 38).

Each is a 400 in the error shape of the API it came in on (OpenAI's on chat,
completions and responses, Anthropic's on messages), sent with the official
SDK where it can send it and as raw HTTP where it cannot (a body nested
100,000 deep, `Infinity`, `1e400`). Seeds and non-finite numbers are also sent
to the real engine (tiny_server), where they used to reach torch.
"""

from __future__ import annotations

import re

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import client_for
from tests.e2e.fixtures import API_KEY
from tests.e2e.test_anthropic_messages import USER, ask, sdk

HEADERS = {"Authorization": f"Bearer {API_KEY}", "x-api-key": API_KEY}
HI = [{"role": "user", "content": "hi"}]
DEEP = "[" * 100_000 + "]" * 100_000
BODIES = {
    "/v1/chat/completions": '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2',
    "/v1/completions": '{"prompt": "hi", "max_tokens": 2',
    "/v1/responses": '{"input": "hi", "max_output_tokens": 2',
    "/v1/messages": '{"model": "scripted", "messages": [{"role": "user", "content": "hi"}], '
    '"max_tokens": 2',
}
NONSENSE = {"type": "object", "properties": {"city": {"type": "nonsense"}}}


def post_raw(server, path: str, body_start: str, tail: str) -> httpx.Response:
    """`body_start` (an object left open) with `tail` added as its last fields."""
    content = body_start + ", " + tail + "}"
    return httpx.post(server.url + path, content=content, headers=HEADERS, timeout=60)


def error_of(response: httpx.Response, path: str) -> dict:
    """The error, checked to be a 400 in the shape of the API at `path`."""
    assert response.status_code == 400, response.text
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error"
    return body["error"]


@pytest.mark.parametrize("path", list(BODIES))
def test_a_body_nested_100000_deep_is_a_400_in_each_apis_shape(scripted, path):
    error = error_of(post_raw(scripted, path, BODIES[path], f'"extra": {DEEP}'), path)
    assert "nests deeper than 100 levels" in error["message"]


def test_the_sdks_get_a_typed_error_for_a_deep_body(scripted):
    deep: list = []
    for _ in range(150):  # deep enough to refuse, shallow enough for the SDKs to send
        deep = [deep]
    with pytest.raises(openai.BadRequestError, match="deeper than 100"):
        client_for(scripted).chat.completions.create(
            model="scripted", messages=HI, max_tokens=2, extra_body={"metadata": deep}
        )
    with pytest.raises(anthropic.BadRequestError, match="deeper than 100") as caught:
        ask(sdk(scripted), metadata={"user_id": "u", "deep": deep})
    assert caught.value.body["error"]["type"] == "invalid_request_error"


def test_deep_arguments_in_the_history_are_not_a_server_error(scripted):
    # Arguments are a string inside the body, so only the renderer meets their nesting.
    arguments = "[" * 2_000 + "]" * 2_000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [*HI, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", **_result()}]
    # The arguments stay text in the prompt, which is then longer than the context.
    with pytest.raises(openai.BadRequestError, match="context"):
        client_for(scripted).chat.completions.create(model="scripted", messages=messages)


def _result() -> dict:
    return {"tool_call_id": "c1", "content": "ok"}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_temperature_that_is_not_finite_is_refused_on_every_route(scripted, path, number):
    error = error_of(post_raw(scripted, path, BODIES[path], f'"temperature": {number}'), path)
    assert "temperature" in error["message"] and "not a finite number" in error["message"]
    if path != "/v1/messages":
        assert error["param"] == "temperature"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_p", "1e400"),
        ("min_p", "NaN"),
        ("presence_penalty", "-1e400"),
        ("frequency_penalty", "Infinity"),
        ("repetition_penalty", "1e308"),
        ("repetition_penalty", "2.5"),
        ("temperature", "2.5"),
        ("top_k", str(2**100)),
        ("seed", str(2**100)),
        ("seed", str(-(2**63) - 1)),
        ("stop_token_ids", f"[{2**40}]"),
        ("n", "17"),
        ("max_tokens", "0"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_numbers_out_of_range_are_named(scripted, path, field, value):
    error = error_of(post_raw(scripted, path, BODIES[path], f'"{field}": {value}'), path)
    assert error["param"].split(".")[0] == field, error


def test_numbers_on_responses_and_messages(scripted):
    responses = '{"input": "hi"'
    for field, value in [("seed", str(2**100)), ("top_p", "1e400"), ("top_k", str(2**100))]:
        error = error_of(post_raw(scripted, "/v1/responses", responses, f'"{field}": {value}'), "")
        assert field in error["message"]
    with pytest.raises(anthropic.BadRequestError, match="top_k"):
        ask(sdk(scripted), extra_body={"top_k": 2**100})
    with pytest.raises(anthropic.BadRequestError, match="top_p"):
        ask(sdk(scripted), extra_body={"top_p": 1.5})


def test_a_huge_seed_through_the_sdk_is_a_400_from_the_real_engine(tiny_server):
    client = client_for(tiny_server)
    with pytest.raises(openai.BadRequestError, match="seed"):
        client.chat.completions.create(model="tiny-llama", messages=HI, max_tokens=2, seed=2**100)
    with pytest.raises(openai.BadRequestError, match="seed"):
        client.completions.create(model="tiny-llama", prompt="x", max_tokens=2, seed=2**64)
    # The largest seed there is, on the last of n choices (seed + 15), still samples.
    reply = client.completions.create(
        model="tiny-llama", prompt="x", max_tokens=2, seed=2**63 - 1, n=16, temperature=1
    )
    assert len(reply.choices) == 16


def test_infinite_temperature_never_reaches_the_real_engine(tiny_server):
    body = '{"model": "tiny-llama", "prompt": "x", "max_tokens": 2'
    for number in ("Infinity", "1e400"):
        error = error_of(
            post_raw(tiny_server, "/v1/completions", body, f'"temperature": {number}'), ""
        )
        assert error["param"] == "temperature"


def test_a_tool_schema_that_is_not_a_json_schema_is_refused_with_tool_choice_auto(scripted):
    client = client_for(scripted)
    tool = {"type": "function", "function": {"name": "weather", "parameters": NONSENSE}}
    for choice in ("auto", "none"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model="scripted", messages=HI, tools=[tool], tool_choice=choice
            )
        assert caught.value.body["param"] == "tools.0.function.parameters.properties.city.type"
        assert "'nonsense' is not a type" in caught.value.body["message"]
    function = {"type": "function", "name": "weather", "parameters": NONSENSE}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="scripted", input="hi", tools=[function])
    assert caught.value.body["param"] == "tools.0.parameters.properties.city.type"
    anthropic_tool = {"name": "weather", "input_schema": NONSENSE}
    for call in (ask, _count_tokens):
        with pytest.raises(anthropic.BadRequestError, match=r"tools\.0\.input_schema\.properties"):
            call(sdk(scripted), tools=[anthropic_tool])
    assert scripted.engine.submitted == []


def _count_tokens(client: anthropic.Anthropic, **kwargs):
    return client.messages.count_tokens(**{"model": "scripted-model", "messages": USER, **kwargs})


def test_valid_tool_schemas_still_pass(scripted):
    tool = {
        "name": "weather",
        "input_schema": {**NONSENSE, "properties": {"c": {"type": "string"}}},
    }
    assert ask(sdk(scripted), tools=[tool]).stop_reason == "end_turn"


TOO_LONG = re.compile(r"^prompt is too long: (\d+) tokens > (\d+) maximum$")


@pytest.mark.parametrize("stream", [False, True])
def test_a_too_long_prompt_reads_as_anthropics_on_messages(scripted, stream):
    long_user = [{"role": "user", "content": "word " * 600}]
    count = _count_tokens(sdk(scripted), messages=long_user).input_tokens
    with pytest.raises(anthropic.BadRequestError) as caught:
        if stream:
            with sdk(scripted).messages.stream(
                model="scripted", max_tokens=64, messages=long_user
            ) as events:
                list(events)
        else:
            ask(sdk(scripted), messages=long_user)
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error"
    match = TOO_LONG.match(error["message"])
    assert match, error["message"]
    # The real numbers: the prompt as counted, the longest prompt that leaves one token.
    assert (int(match[1]), int(match[2])) == (count, 511)
    assert scripted.engine.submitted == []


def test_other_routes_keep_their_own_words(scripted):
    long_user = [{"role": "user", "content": "word " * 600}]
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(scripted).chat.completions.create(model="scripted", messages=long_user)
    assert caught.value.code == "context_length_exceeded"
    assert "prompt is too long" not in caught.value.body["message"]
