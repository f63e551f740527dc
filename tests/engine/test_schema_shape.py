"""Every tool schema is checked to be a JSON Schema (engine.grammar.schema_shape; issue 38).

What real clients send passes (Claude Code's draft-07 schemas, pydantic's
$defs and nullable unions, draft-4 habits, the agent's own tools); what no
JSON Schema draft allows is refused with the path to the problem.
"""

from __future__ import annotations

import pytest

from engine.grammar import GrammarError
from engine.grammar.schema_shape import check_json_schema
from tools import default_registry

CLAUDE_CODE_EDIT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "file_path": {"type": "string", "description": "The absolute path"},
        "old_string": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False},
        "limit": {"type": "number", "exclusiveMinimum": 0},
        "todos": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"status": {"type": "string", "enum": ["pending", "done"]}},
                "required": ["status"],
            },
            "minItems": 1,
        },
    },
    "required": ["file_path", "old_string"],
}
PYDANTIC = {
    "$defs": {"Point": {"properties": {"x": {"title": "X", "type": "integer"}}, "type": "object"}},
    "properties": {
        "where": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}], "default": None},
        "tags": {"items": {"type": "string"}, "type": "array", "uniqueItems": True},
        "ratio": {"type": ["number", "null"], "minimum": 0, "maximum": 1.5, "multipleOf": 0.5},
    },
    "required": [],
    "title": "Args",
    "type": "object",
}
DRAFT_4 = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maxLength": 2.0},
        "pair": {"type": "array", "items": [{"type": "string"}, True], "additionalItems": False},
    },
    "dependencies": {"a": ["b"], "c": {"required": ["d"]}},
    "patternProperties": {"^x-": {}},
    "x-vendor-annotation": {"anything": ["goes", 1]},
}


@pytest.mark.parametrize("schema", [CLAUDE_CODE_EDIT, PYDANTIC, DRAFT_4, {}, {"not": True}])
def test_schemas_clients_send_pass(schema):
    check_json_schema(schema, "tools.0.function.parameters")


def test_the_agents_own_tool_schemas_pass():
    for tool in default_registry().schemas():
        check_json_schema(tool["function"]["parameters"], tool["function"]["name"])


@pytest.mark.parametrize(
    ("schema", "param", "words"),
    [
        ({"type": "nonsense"}, "p.type", "'nonsense' is not a type"),
        ({"type": []}, "p.type", "empty list"),
        ({"type": ["string", "string"]}, "p.type", "listed twice"),
        ({"properties": []}, "p.properties", "object of schemas"),
        ({"properties": {"a": "string"}}, "p.properties.a", "object or a boolean"),
        ({"properties": {"a": {"type": "strin"}}}, "p.properties.a.type", "'strin'"),
        ({"required": "a"}, "p.required", "list of property names"),
        ({"required": [1]}, "p.required", "list of property names"),
        ({"minLength": -1}, "p.minLength", "non-negative integer"),
        ({"maxItems": 1.5}, "p.maxItems", "non-negative integer"),
        ({"maxItems": True}, "p.maxItems", "non-negative integer"),
        ({"multipleOf": 0}, "p.multipleOf", "above zero"),
        ({"minimum": "0"}, "p.minimum", "number"),
        ({"anyOf": []}, "p.anyOf", "non-empty list"),
        ({"oneOf": [{"type": "x"}]}, "p.oneOf.0.type", "'x'"),
        ({"items": "string"}, "p.items", "object or a boolean"),
        ({"items": {"items": {"enum": 3}}}, "p.items.items.enum", "must be a list"),
        ({"pattern": 5}, "p.pattern", "string"),
        ({"$ref": {"a": 1}}, "p.$ref", "string"),
        ({"uniqueItems": "yes"}, "p.uniqueItems", "true or false"),
        ({"dependentRequired": {"a": "b"}}, "p.dependentRequired", "lists of names"),
        ({"dependencies": {"a": 5}}, "p.dependencies.a", "object or a boolean"),
        ({"additionalProperties": "no"}, "p.additionalProperties", "object or a boolean"),
    ],
)
def test_what_no_draft_allows_is_refused_by_path(schema, param, words):
    with pytest.raises(GrammarError, match="not a valid JSON Schema") as caught:
        check_json_schema(schema, "p")
    assert caught.value.param == param
    assert words in str(caught.value) and str(caught.value).startswith(param + ":")


def test_nesting_past_the_grammar_depth_is_refused():
    schema: dict = {"type": "string"}
    for _ in range(70):
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(GrammarError, match="deeper than"):
        check_json_schema(schema, "p")
