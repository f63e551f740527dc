"""Naming a call from its arguments: exactly one fitting tool, or none."""

from __future__ import annotations

import random

from engine.chat.tool_parsers.schema_match import arguments_fit, matching_tools
from tests.engine.chat.cases import tool

TOOLS = [
    tool("Read", {"file_path": {"type": "string"}, "limit": {"type": "integer"}}, ["file_path"]),
    tool(
        "Write",
        {"file_path": {"type": "string"}, "content": {"type": "string"}},
        ["file_path", "content"],
    ),
    tool("Glob", {"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"]),
    tool(
        "Grep",
        {"pattern": {"type": "string"}, "path": {"type": "string"}, "mode": {"type": "string"}},
        ["pattern"],
    ),
    tool(
        "LS",
        {"path": {"type": "string"}, "ignore": {"type": "array", "items": {"type": "string"}}},
        ["path"],
    ),
    tool("Ping"),
]


def test_required_and_declared_keys_decide():
    assert matching_tools({"file_path": "/x"}, TOOLS) == ["Read"]
    assert matching_tools({"file_path": "/x", "content": "c"}, TOOLS) == ["Write"]
    assert matching_tools({"path": "/x"}, TOOLS) == ["LS"]
    assert matching_tools({"pattern": "a", "mode": "c"}, TOOLS) == ["Grep"]
    assert matching_tools({}, TOOLS) == ["Ping"]


def test_ambiguity_and_misfits_are_reported_as_such():
    assert matching_tools({"pattern": "a", "path": "/x"}, TOOLS) == ["Glob", "Grep"]
    assert matching_tools({"file_path": "/x", "bogus": 1}, TOOLS) == []
    assert matching_tools({"file_path": 5}, TOOLS) == []
    assert matching_tools({"path": "/x", "ignore": ["a", 1]}, TOOLS) == []
    assert matching_tools({"file_path": "/x", "limit": True}, TOOLS) == [], "true is not an integer"


def test_tool_order_does_not_matter():
    shuffled = TOOLS[:]
    random.Random(0).shuffle(shuffled)
    for arguments in ({"file_path": "/x"}, {"path": "/x"}, {"pattern": "a"}, {}):
        assert sorted(matching_tools(arguments, shuffled)) == sorted(
            matching_tools(arguments, TOOLS)
        )


def test_composite_const_and_extra_key_schemas():
    locate = {
        "type": "object",
        "anyOf": [
            {"properties": {"city": {"type": "string"}}, "required": ["city"]},
            {"properties": {"zip": {"type": "string"}}, "required": ["zip"]},
        ],
    }
    assert arguments_fit({"zip": "94110"}, locate)
    assert not arguments_fit({}, locate)
    delete = {
        "type": "object",
        "properties": {"action": {"const": "delete"}},
        "required": ["action"],
    }
    assert arguments_fit({"action": "delete"}, delete) and not arguments_fit(
        {"action": "read"}, delete
    )
    dispatch = {"type": "object", "additionalProperties": {"type": "string"}}
    assert arguments_fit({"anything": "x"}, dispatch) and not arguments_fit(
        {"anything": 5}, dispatch
    )


def test_schemas_that_are_booleans_or_missing():
    assert arguments_fit({}, True) and not arguments_fit({"q": 1}, True)
    assert arguments_fit({}, None) and not arguments_fit({"q": 1}, None)
    assert not arguments_fit({}, False)
    assert not arguments_fit({"x": 1}, {"type": "object"})
