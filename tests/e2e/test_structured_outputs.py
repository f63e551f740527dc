"""Constrained decoding over HTTP: what `tool_choice` and `response_format` ask of the engine,
the 400s for schemas it cannot enforce, and the default model's constrained answers.

The scripted server shows the mapping (the constraint each request submits)
without a model; the default model (FP8 KV) shows the answers: valid JSON and
valid calls, the same whether streamed or not.
"""

from __future__ import annotations

import json

import openai
import pytest

from engine.chat.json_schema import schema_errors
from tests.e2e.conftest import client_for
from tests.e2e.fixtures import SEARCH_TOOL, WEATHER_TOOL

MESSAGES = [{"role": "user", "content": "Weather in Paris, as JSON please."}]
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "celsius": {"type": "integer", "minimum": -60, "maximum": 60},
    },
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


def submitted(scripted, **fields):
    client_for(scripted).chat.completions.create(
        model="scripted", messages=MESSAGES, max_tokens=8, **fields
    )
    return scripted.engine.submitted[-1].params.structured


def test_tool_choice_required_and_named_become_call_grammars(scripted):
    tools = [WEATHER_TOOL, SEARCH_TOOL]
    required = submitted(scripted, tools=tools, tool_choice="required")
    assert required.tool_calls.required and required.tool_calls.parallel
    assert required.tool_calls.format == "hermes"  # the parser the renderer chose
    assert [t.name for t in required.tool_calls.tools] == ["get_weather", "web.search-v2"]
    named = submitted(
        scripted,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "web.search-v2"}},
    )
    assert [t.name for t in named.tool_calls.tools] == ["web.search-v2"]
    assert not named.tool_calls.parallel  # a named function: exactly one call
    one = submitted(scripted, tools=tools, tool_choice="required", parallel_tool_calls=False)
    assert not one.tool_calls.parallel
    assert submitted(scripted, tools=tools, tool_choice="auto") is None
    assert submitted(scripted, tools=tools) is None


def test_response_formats_become_json_grammars(scripted):
    schema_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": CITY}}
    spec = submitted(scripted, response_format=schema_format)
    assert spec.json_schema == CITY and spec.tool_calls is None
    assert submitted(scripted, response_format={"type": "json_object"}).json_object
    assert submitted(scripted, response_format={"type": "text"}) is None
    # Tools offered too: the JSON answer, or calls.
    both = submitted(scripted, response_format=schema_format, tools=[WEATHER_TOOL])
    assert both.json_schema == CITY and both.tool_calls.required
    none = submitted(
        scripted, response_format=schema_format, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert none.tool_calls is None


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "w",
                        "schema": {"type": "object", "properties": {"n": {"not": {}}}},
                    },
                }
            },
            "response_format.json_schema.schema.properties.n",
            "not is not supported",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "w", "schema": {"type": "strnig"}},
                }
            },
            "response_format.json_schema.schema",
            "strnig",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "w"}}},
            "response_format",
            "schema is required",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a b", "schema": {}},
                }
            },
            "response_format.json_schema.name",
            "pattern",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
        (
            {
                "tool_choice": "required",
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "array", "uniqueItems": True},
                        },
                    }
                ],
            },
            "tools.0.function.parameters",
            "uniqueItems",
        ),
    ],
)
def test_schemas_that_cannot_be_enforced_are_400s_naming_the_place(scripted, fields, param, words):
    before = len(scripted.engine.submitted)
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(scripted).chat.completions.create(
            model="scripted", messages=MESSAGES, max_tokens=8, **fields
        )
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param
    assert words in error["message"] and error["type"] == "invalid_request_error"
    assert len(scripted.engine.submitted) == before  # refused before anything ran


# ----- the default model --------------------------------------------------------------------

MODEL = "smollm2-135m-instruct"
# Bounded by patterns, which also keep `</tool_call>` out (engine/grammar/tool_calls.py).
PATH = "^[A-Za-z0-9_./-]{1,40}$"
COMMAND = "^[A-Za-z0-9 _./|=-]{1,48}$"
READ_TOOL = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a file of the repository.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "pattern": PATH}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
}
SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "pattern": COMMAND}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (READ_TOOL, SHELL_TOOL)}


def both_ways(client, salt: str, **fields):
    """The same greedy request non-streamed and streamed (apart in the prefix cache, so
    both prefill cold): the message, and the streamed text, calls and finish reason."""
    body = {"model": MODEL, "temperature": 0, "max_tokens": 96, **fields}
    whole = client.chat.completions.create(**body, extra_body={"cache_salt": salt + "-a"})
    text, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(
        **body, stream=True, extra_body={"cache_salt": salt + "-b"}
    ):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
        finish = choice.finish_reason or finish
    return whole.choices[0], text, [calls[i] for i in sorted(calls)], finish


@pytest.mark.slow
def test_json_schema_answers_validate_streamed_or_not(fp8_server):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": CITY, "strict": True},
    }
    choice, streamed, _, finish = both_ways(
        client_for(fp8_server, api_key=None), "json", messages=MESSAGES, response_format=fmt
    )
    assert choice.finish_reason == finish == "stop"
    assert schema_errors(json.loads(choice.message.content), CITY) == []
    assert streamed == choice.message.content


@pytest.mark.slow
@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "shell"}}]
)
def test_forced_tool_calls_validate_streamed_or_not(fp8_server, tool_choice):
    # One call: given the choice, this small model writes calls until max_tokens
    # (tests/engine/test_structured_output.py checks those too).
    messages = [{"role": "user", "content": "List the files in the src directory."}]
    choice, _, streamed_calls, finish = both_ways(
        client_for(fp8_server, api_key=None),
        f"tools-{tool_choice if isinstance(tool_choice, str) else 'named'}",
        messages=messages,
        tools=[READ_TOOL, SHELL_TOOL],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
    )
    assert choice.finish_reason == finish == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and not choice.message.content
    if isinstance(tool_choice, dict):
        assert [call.function.name for call in calls] == ["shell"]
    for call in calls:
        assert schema_errors(json.loads(call.function.arguments), SCHEMAS[call.function.name]) == []
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed_calls] == [
        (call.function.name, json.loads(call.function.arguments)) for call in calls
    ]
