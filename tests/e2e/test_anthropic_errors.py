"""Anthropic Messages API errors, in Anthropic's shape, as the anthropic SDK types them.

`{"type": "error", "error": {"type", "message"}}` with the status codes the SDK
maps to its exceptions: 400 invalid_request_error, 401 authentication_error,
404 not_found_error, 529 overloaded_error, 500 api_error; after a stream has
started, an `error` event. Against the scripted engine (see
test_anthropic_messages.py); also how a malformed streamed call ends.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from engine.chat import ContentDelta, ToolCallDelta, ToolCallError
from engine.server.anthropic_blocks import ContentBlocks
from engine.server.anthropic_protocol import MessagesRequest
from engine.server.anthropic_translate import chat_fields
from tests.e2e.fixtures import API_KEY
from tests.e2e.scripted_engine import Script
from tests.e2e.test_anthropic_messages import USER, ask, sdk


def test_max_tokens_is_cut_to_the_room_left(scripted):
    scripted.engine.push(
        Script(["a"], finish_reason="length"), Script(["a"], finish_reason="length")
    )
    client = sdk(scripted)
    # Claude Code asks for 32000 output tokens whatever the model; the context here is 512.
    reply = ask(client, max_tokens=32000)
    submitted = scripted.engine.submitted[0]
    assert submitted.params.max_tokens == 512 - len(submitted.prompt)
    assert reply.stop_reason == "model_context_window_exceeded"
    assert ask(client, max_tokens=4).stop_reason == "max_tokens"
    # A prompt with no room left is refused in Anthropic's words (test_shape_limits.py).
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        ask(client, messages=[{"role": "user", "content": "word " * 600}])


def test_errors_are_typed_by_the_sdk_and_in_anthropic_shape(scripted):
    client = sdk(scripted)
    with pytest.raises(anthropic.NotFoundError) as caught:
        ask(client, model="gpt-4o")
    assert caught.value.body["error"]["type"] == "not_found_error"
    # Claude Code's default model names stand for the served model, which the reply names.
    assert ask(client, model="claude-haiku-4-5").model == "scripted-model"
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        ask(client, extra_body={"temperature": 1.5})
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(anthropic.BadRequestError, match="reads text only"):
        ask(client, messages=[{"role": "user", "content": [image]}])
    # A bad block is named by its path, not by the union members pydantic tried.
    no_text = [{"role": "user", "content": [{"type": "text"}]}]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.content\.0\.text: Field"):
        ask(client, messages=no_text)
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        ask(client, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.AuthenticationError) as caught:
        ask(sdk(scripted, api_key="wrong"))
    assert caught.value.body["error"]["type"] == "authentication_error"
    # A bearer token (the SDK's auth_token, Claude Code's ANTHROPIC_AUTH_TOKEN) also works.
    bearer = anthropic.Anthropic(base_url=scripted.url, auth_token=API_KEY, max_retries=0)
    assert ask(bearer).content[0].text == "Hello there."
    scripted.engine.push(Script([], overloaded=True))
    # InternalServerError: what older SDKs raise for 529 (newer ones subclass it as OverloadedError).
    with pytest.raises(anthropic.InternalServerError) as caught:
        ask(client)
    assert caught.value.status_code == 529
    assert caught.value.response.headers["retry-after"] == "1"
    assert caught.value.body["error"]["type"] == "overloaded_error"


def test_raw_errors_missing_max_tokens_bad_json_and_no_key(scripted):
    url = scripted.url + "/v1/messages"
    key = {"x-api-key": API_KEY}
    cases = [
        (httpx.post(url, json={"model": "scripted", "messages": USER}, headers=key), 400),
        (httpx.post(url, content=b"{nope", headers=key), 400),
        (httpx.post(url, json={"model": "scripted", "max_tokens": 4, "messages": []}), 401),
        (httpx.post(url + "/count_tokens", json={"messages": USER}, headers=key), 400),
    ]
    for response, status in cases:
        assert response.status_code == status, response.text
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert "max_tokens" in cases[0][0].json()["error"]["message"]
    assert cases[0][0].json()["error"]["type"] == "invalid_request_error"
    assert cases[2][0].json()["error"]["type"] == "authentication_error"


def test_engine_failure_is_an_api_error(scripted):
    message = "the request needs 9 KV pages but only 2 of 8 can be freed"
    scripted.engine.push(Script(["a"], error=message), Script(["a", "b"], error=message))
    client = sdk(scripted)
    with pytest.raises(anthropic.InternalServerError, match="KV pages") as caught:
        ask(client)
    assert caught.value.body["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError, match="KV pages"):
        with client.messages.stream(model="scripted", max_tokens=8, messages=USER) as stream:
            stream.get_final_message()


def test_structured_output_is_chats_response_format(scripted):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    output_config = {"format": {"type": "json_schema", "schema": schema}}
    body = {"model": "m", "max_tokens": 8, "messages": USER, "output_config": output_config}
    fields = chat_fields(MessagesRequest.model_validate(body))
    assert fields["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }
    # Served exactly where chat serves json_schema; where it does not, the
    # refusal names the Messages field the client sent.
    try:
        reply = ask(sdk(scripted), extra_body={"output_config": output_config})
    except anthropic.BadRequestError as error:
        assert "output_config.format" in str(error) and "response_format" not in str(error)
    else:
        assert reply.content[0].type == "text"


def test_a_voided_streamed_call_is_closed_and_left_out_of_the_content():
    # Parsers that stream arguments may void a call they announced; a stream
    # cannot take the block back, so it ends there and its text follows.
    blocks = ContentBlocks()
    events = blocks.feed(
        [
            ToolCallDelta(0, "", id="call_1", name="get_weather"),
            ToolCallDelta(0, '{"city": '),
            ToolCallError("unterminated arguments", index=0),
            ContentDelta('<tool_call>{"city": '),
        ]
    )
    events += blocks.finish()
    assert [(e["type"], e["index"]) for e in events] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
    ]
    assert blocks.content() == [{"type": "text", "text": '<tool_call>{"city": '}]
    assert not blocks.made_tool_calls
