"""The Anthropic Messages API (/v1/messages) through the official anthropic SDK.

Against the scripted engine (tests/e2e/scripted_engine.py), which lets a test
choose the model's text, so tool_use, thinking, stop reasons and usage are
checked exactly (errors: test_anthropic_errors.py); and against the tiny random checkpoint for
what needs a real engine: the prefix cache's `cache_read_input_tokens` and a
stop sequence ending generation. The SDK sends `x-api-key`, so every call here
also checks that header is accepted.
"""

from __future__ import annotations

import json
import time
import uuid

import anthropic
import httpx
import pytest

from engine.server import anthropic_stream
from engine.server.anthropic_protocol import MessagesRequest
from engine.server.anthropic_translate import to_chat_request
from tests.e2e.fixtures import API_KEY, HERMES_TEMPLATE, served
from tests.e2e.scripted_engine import Script, ScriptedEngine

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SEARCH_CALL = '<tool_call>{"name": "search", "arguments": {"q": "rain"}}</tool_call>'
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
SEARCH = {"name": "search", "input_schema": {"type": "object", "properties": {"q": {}}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
# A reasoning template with a switch, as GLM's and Qwen's have: thinking opens
# the generation prompt unless `enable_thinking` is false.
SWITCH_TEMPLATE = HERMES_TEMPLATE.replace(
    "{%- if add_generation_prompt %}<|im_start|>assistant\n",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>\n"
    "{% else %}<think>\n{% endif %}",
)
THOUGHT_AND_CALL = "The user wants weather.\n</think>\n\nIt is sunny." + CALL_TEXT


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def sdk(server, api_key: str | None = API_KEY, **kwargs) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=api_key, max_retries=0, timeout=60, **kwargs
    )


def ask(client: anthropic.Anthropic, **kwargs):
    fields = {"model": "scripted-model", "max_tokens": 64, "messages": USER, **kwargs}
    return client.messages.create(**fields)


def raw_events(server, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    headers = headers or {"x-api-key": API_KEY}
    response = httpx.post(server.url + "/v1/messages", json=body, headers=headers, timeout=60)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for frame in response.text.split("\n\n"):
        if frame:
            kind, data = frame.split("\n")
            assert kind.startswith("event: ") and data.startswith("data: ")
            payload = json.loads(data[len("data: ") :])
            assert payload["type"] == kind[len("event: ") :]
            events.append((payload["type"], payload))
    return events


@pytest.fixture(scope="module")
def thinking(hermes_tok):
    """A scripted server whose template opens <think> unless thinking is switched off."""
    from engine.server.app import create_app
    from engine.server.background import BackgroundServer

    engine = ScriptedEngine()
    with BackgroundServer(create_app(engine, served(hermes_tok, SWITCH_TEMPLATE), API_KEY)) as s:
        s.engine = engine
        yield s


def test_text_message_and_sampling_fields(scripted, hermes_tok):
    reply = ask(
        sdk(scripted),
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        # This SDK release dropped the sampling fields from its signature; the API,
        # and older clients such as Claude Code's, still send them.
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20},
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == "scripted-model"
    assert [(b.type, b.text) for b in reply.content] == [("text", "Hello there.")]
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    submitted = scripted.engine.submitted[0]
    assert reply.usage.input_tokens == len(submitted.prompt)
    assert reply.usage.output_tokens == 3
    assert reply.usage.cache_read_input_tokens == 0
    assert reply.usage.cache_creation_input_tokens == 0
    params = submitted.params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (64, 0.5, 0.9, 20)
    assert params.stop == ["END"]
    prompt = hermes_tok.decode(submitted.prompt)
    assert "Be brief.\nBe kind." in prompt and "Weather in Paris?" in prompt


def test_streaming_through_both_sdk_entry_points(scripted):
    scripted.engine.push(Script(["Hello", " there", "."]), Script(["Hello", " there", "."]))
    client = sdk(scripted)
    with client.messages.stream(model="scripted", max_tokens=16, messages=USER) as stream:
        assert "".join(stream.text_stream) == "Hello there."
        final = stream.get_final_message()
    assert final.content[0].text == "Hello there." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 3
    events = list(ask(client, stream=True))
    kinds = [event.type for event in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0].message.usage.input_tokens == len(scripted.engine.submitted[1].prompt)
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == (
        "Hello there."
    )
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 3


def test_raw_event_stream_framing_and_pings(scripted, monkeypatch):
    body = {"model": "scripted", "max_tokens": 8, "messages": USER, "stream": True}
    events = raw_events(scripted, body)
    assert [kind for kind, _ in events[:2]] == ["message_start", "ping"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert events[-1] == ("message_stop", {"type": "message_stop"})
    # A silent stretch (a tool call being held, a slow step) is filled with pings.
    monkeypatch.setattr(anthropic_stream, "PING_SECONDS", 0.05)
    scripted.engine.push(Script(["a", "b"], delay=0.3))
    kinds = [kind for kind, _ in raw_events(scripted, body)]
    assert kinds.count("ping") >= 3 and kinds[-1] == "message_stop"


def test_client_disconnect_aborts_the_request(scripted):
    scripted.engine.push(Script(["x"] * 500, delay=0.01))
    body = {"model": "scripted", "max_tokens": 600, "messages": USER, "stream": True}
    headers = {"x-api-key": API_KEY}
    url = scripted.url + "/v1/messages"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(12):
            next(lines)
        assert scripted.engine.active
    deadline = time.monotonic() + 30
    while scripted.engine.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not scripted.engine.active


@pytest.mark.parametrize("size", [1, 5, 500])
def test_tool_use_then_tool_result_round_trip(scripted, hermes_tok, size):
    scripted.engine.push(Script(pieces("Let me check." + CALL_TEXT, size)))
    client = sdk(scripted)
    with client.messages.stream(
        model="scripted", max_tokens=64, messages=USER, tools=[WEATHER]
    ) as stream:
        reply = stream.get_final_message()
    assert reply.stop_reason == "tool_use"
    text, call = reply.content
    assert (text.type, text.text) == ("text", "Let me check.")
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert call.id
    # The same output, not streamed, gives the same content.
    scripted.engine.push(Script(pieces("Let me check." + CALL_TEXT, size)))
    whole = ask(client, tools=[WEATHER])
    assert whole.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in whole.content] == [
        ("text", None),
        ("tool_use", {"city": "Paris"}),
    ]
    history = USER + [
        {"role": "assistant", "content": reply.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "18C and sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    answer = ask(client, messages=history, tools=[WEATHER])
    assert answer.content[0].text == "Hello there."
    prompt = hermes_tok.decode(scripted.engine.submitted[-1].prompt)
    assert '"arguments": {"city": "Paris"}' in prompt
    assert "<tool_response>\n18C and sunny\n</tool_response>" in prompt
    assert prompt.index("18C and sunny") < prompt.index("And tomorrow?")


def test_tool_result_blocks_and_errors_render(scripted, hermes_tok):
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "is_error": True,
        "content": [{"type": "text", "text": "city not found"}],
    }
    messages = USER + [
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    ask(sdk(scripted), messages=messages, tools=[WEATHER])
    prompt = hermes_tok.decode(scripted.engine.submitted[0].prompt)
    assert "<tool_response>\nError: city not found\n</tool_response>" in prompt


def test_tool_choice_and_parallel_calls(scripted, hermes_tok):
    client = sdk(scripted)
    two_calls = "Both." + CALL_TEXT + SEARCH_CALL
    scripted.engine.push(Script(pieces(two_calls)), Script(pieces(two_calls)))
    both = ask(client, tools=[WEATHER, SEARCH], tool_choice={"type": "any"})
    assert [b.name for b in both.content if b.type == "tool_use"] == ["get_weather", "search"]
    first = ask(
        client,
        tools=[WEATHER, SEARCH],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert [b.name for b in first.content if b.type == "tool_use"] == ["get_weather"]
    scripted.engine.push(Script(pieces(CALL_TEXT)), Script(pieces(CALL_TEXT)))
    ask(client, tools=[WEATHER, SEARCH], tool_choice={"type": "tool", "name": "search"})
    prompt = hermes_tok.decode(scripted.engine.submitted[-1].prompt)
    assert '"search"' in prompt and "get_weather" not in prompt
    none = ask(client, tools=[WEATHER], tool_choice={"type": "none"})
    assert none.stop_reason == "end_turn" and none.content[0].text == CALL_TEXT


def test_thinking_blocks_from_reasoning(thinking):
    thinking.engine.push(Script(pieces(THOUGHT_AND_CALL, 2)), Script(pieces(THOUGHT_AND_CALL, 2)))
    client = sdk(thinking)
    reply = ask(client, tools=[WEATHER])
    kinds = [block.type for block in reply.content]
    assert kinds == ["thinking", "text", "tool_use"]
    thought = reply.content[0]
    assert thought.thinking == "The user wants weather." and thought.signature
    assert reply.content[1].text == "It is sunny." and reply.stop_reason == "tool_use"
    with client.messages.stream(
        model="scripted", max_tokens=64, messages=USER, tools=[WEATHER]
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert "thinking_delta" in deltas and "signature_delta" in deltas
    assert "input_json_delta" in deltas

    def without_ids(blocks):  # each response names its calls afresh
        return [{**b.model_dump(), "id": None} for b in blocks]

    assert without_ids(streamed.content) == without_ids(reply.content)


def test_thinking_switch_reaches_the_template(thinking, hermes_tok):
    thinking.engine.submitted.clear()
    thinking.engine.push(Script(["Just the answer."]))
    reply = ask(sdk(thinking), thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in reply.content] == [("text", "Just the answer.")]
    prompt = hermes_tok.decode(thinking.engine.submitted[0].prompt)
    assert prompt.endswith("<think></think>\n")
    thinking.engine.push(Script(["Hmm.</think>Yes."]))
    reply = ask(sdk(thinking), max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert hermes_tok.decode(thinking.engine.submitted[1].prompt).endswith("<think>\n")


def test_thinking_in_history_and_prefill_translate():
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": USER
            + [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Look it up.", "signature": "x"},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
                {"role": "assistant", "content": "It is"},
            ],
        }
    )
    chat = to_chat_request(body)
    roles = [m.role for m in chat.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    called = chat.messages[1]
    assert called.reasoning_content == "Look it up." and called.content == "Checking."
    assert called.tool_calls[0]["function"] == {"name": "get_weather", "arguments": "{}"}
    assert chat.messages[2].tool_call_id == "t1" and chat.messages[2].content == ""
    assert chat.continue_final_message


def test_prefill_is_continued(scripted, hermes_tok):
    messages = USER + [{"role": "assistant", "content": "The weather is"}]
    reply = ask(sdk(scripted), messages=messages)
    assert reply.content[0].text == "Hello there."
    assert hermes_tok.decode(scripted.engine.submitted[0].prompt).endswith("The weather is")


def test_usage_reports_cache_reads(scripted):
    scripted.engine.push(Script(["a", "b"], cached_tokens=16), Script(["a", "b"], cached_tokens=16))
    client = sdk(scripted)
    usage = ask(client).usage
    prompt_tokens = len(scripted.engine.submitted[0].prompt)
    assert usage.cache_read_input_tokens == 16
    assert usage.input_tokens == prompt_tokens - 16 and usage.output_tokens == 2
    with client.messages.stream(model="scripted", max_tokens=8, messages=USER) as stream:
        streamed = stream.get_final_message().usage
    assert streamed.model_dump() == usage.model_dump()


def test_count_tokens_matches_the_rendered_prompt(scripted):
    client = sdk(scripted)
    counted = client.messages.count_tokens(
        model="scripted", messages=USER, system="Be brief.", tools=[WEATHER]
    )
    ask(client, system="Be brief.", tools=[WEATHER])
    assert counted.input_tokens == len(scripted.engine.submitted[0].prompt)
    # Claude Code adds `?beta=true` to both routes.
    response = httpx.post(
        scripted.url + "/v1/messages/count_tokens?beta=true",
        json={"model": "scripted", "messages": USER, "system": "Be brief.", "tools": [WEATHER]},
        headers={"x-api-key": API_KEY, "anthropic-beta": "token-counting-2024-11-01"},
    )
    assert response.json() == {"input_tokens": counted.input_tokens}


def test_real_prefix_cache_and_stop_sequence(tiny_server):
    client = sdk(tiny_server)
    system = f"Session {uuid.uuid4().hex}. " + "Answer questions about Python lists. " * 12

    def send(question: str, **kwargs):
        messages = [{"role": "user", "content": question}]
        return client.messages.create(
            model="tiny-llama",
            system=system,
            messages=messages,
            extra_body={"temperature": 0},
            **kwargs,
        )

    cold = send("What is a list?", max_tokens=2).usage
    assert cold.cache_read_input_tokens < 16 and cold.input_tokens > 100
    warm = send("What is a dict?", max_tokens=2).usage
    assert warm.cache_read_input_tokens >= cold.input_tokens - 32
    assert warm.input_tokens + warm.cache_read_input_tokens > 100
    text = send("Go on.", max_tokens=12).content[0].text
    assert len(text) >= 4, text
    stopped = send("Go on.", max_tokens=12, stop_sequences=[text[2:4]])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == text[2:4]


def test_system_turns_inside_messages_keep_their_place(scripted):
    """Claude Code sends reminders as `system` turns between user turns."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "system", "content": [{"type": "text", "text": "Agent types: Explore."}]},
        {"role": "user", "content": "And in Lima?"},
    ]
    chat = to_chat_request(MessagesRequest(model="m", max_tokens=8, messages=messages))
    assert [(m.role, m.content) for m in chat.messages] == [
        ("user", "Weather in Paris?"),
        ("system", "Agent types: Explore."),
        ("user", "And in Lima?"),
    ]
    assert ask(sdk(scripted), messages=messages).content[0].text == "Hello there."
    bad = {"role": "system", "content": [{"type": "image", "source": {}}]}
    with pytest.raises(anthropic.BadRequestError) as raised:
        ask(sdk(scripted), messages=[*USER, bad])
    assert "messages.1.content.0" in str(raised.value)
