"""Tool schemas and argument validation: a malformed call is an error result, never a crash."""

from __future__ import annotations

import json

import pytest
from pydantic import Field

from tools import Arguments, Effect, Registry, Tool, ToolCall, ToolResult
from tools.schema import clean_schema


def _walk(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, path)


def test_schemas_are_sorted_openai_function_entries(registry):
    schemas = registry.schemas()
    names = [s["function"]["name"] for s in schemas]
    assert names == sorted(names)
    assert {"read", "write", "edit", "list", "glob", "grep", "shell", "git_commit"} <= set(names)
    for schema in schemas:
        assert schema["type"] == "function"
        assert set(schema["function"]) == {"name", "description", "parameters"}
        parameters = schema["function"]["parameters"]
        assert parameters["type"] == "object"
        assert parameters["additionalProperties"] is False
        assert isinstance(parameters["required"], list)


def test_schemas_have_no_title_noise_or_null_unions(registry):
    for schema in registry.schemas():
        for path, key, value in _walk(schema):
            in_properties = path and path[-1] == "properties"
            assert key != "title" or in_properties, schema["function"]["name"]
            assert key != "anyOf", schema["function"]["name"]
            assert not (key == "default" and value is None)


def test_required_fields_are_listed(registry):
    by_name = {s["function"]["name"]: s["function"]["parameters"] for s in registry.schemas()}
    assert by_name["read"]["required"] == ["path"]
    assert set(by_name["edit"]["required"]) == {"path", "old_string", "new_string"}
    assert by_name["shell"]["required"] == ["command"]
    assert by_name["read"]["properties"]["limit"]["type"] == "integer"  # optional, not a union


def test_clean_schema_keeps_a_property_named_title():
    class Note(Arguments):
        title: str = Field(description="the note's title")

    from tools.schema import parameters_schema

    schema = parameters_schema(Note)
    assert "title" in schema["properties"]
    assert schema["required"] == ["title"]
    assert clean_schema({"title": "X", "type": "string"}) == {"type": "string"}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"path": "a.txt", ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"a.txt"', "must be a JSON object"),
        ({"path": 5}, "path: Input should be a valid string"),
        ({"path": "a", "offset": "abc"}, "offset"),
        ({"path": "a", "offset": 0}, "offset"),
        ({}, "path: required field is missing"),
        ({"path": "a", "mode": "x"}, "mode: unknown field"),
    ],
)
def test_invalid_arguments_become_error_results(registry, ctx, arguments, expected):
    result = registry.call("read", arguments, ctx)
    assert isinstance(result, ToolResult)
    assert not result.ok
    assert expected in result.output
    assert '"path": string' in result.output  # the expected shape is quoted back


def test_unknown_tool_lists_the_available_ones(registry, ctx):
    result = registry.call("rm_rf", {}, ctx)
    assert not result.ok
    assert "Unknown tool" in result.output and "read" in result.output


def test_empty_argument_string_means_no_arguments(registry):
    call = registry.parse("git_status", "")
    assert isinstance(call, ToolCall)
    assert call.access.effect is Effect.READ


def test_parse_accepts_json_text_and_computes_access(registry):
    call = registry.parse("write", json.dumps({"path": "x.py", "content": "1"}), call_id="c1")
    assert isinstance(call, ToolCall)
    assert call.call_id == "c1"
    assert call.access.paths == ("x.py",)
    assert call.access.effect is Effect.WRITE


class _Boom(Tool):
    name = "boom"
    description = "always fails"
    effect = Effect.READ

    class Args(Arguments):
        pass

    def run(self, args, ctx):
        raise RuntimeError("kaboom")


def test_a_tool_exception_is_an_error_result(ctx):
    registry = Registry([_Boom()])
    result = registry.call("boom", {}, ctx)
    assert not result.ok
    assert "RuntimeError: kaboom" in result.output


def test_duplicate_tool_names_are_rejected():
    registry = Registry([_Boom()])
    with pytest.raises(ValueError):
        registry.register(_Boom())
