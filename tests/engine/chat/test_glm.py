"""GLM-4.5/4.6 and GLM-4.7 tool calls: key/value tags turned into streamed JSON."""

from __future__ import annotations

import json

import pytest

from engine.chat import ToolCallDelta, ToolCallEnd
from engine.chat.tool_parsers import Glm45ToolParser, Glm47ToolParser
from tests.engine.chat.streaming import (
    assert_streams_like_complete,
    call_summary,
    counting_ids,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search.code-index",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "score": {"type": "number"},
                    "regex": {"type": "boolean"},
                    "paths": {"type": "array", "items": {"type": "string"}},
                    "options": {"type": "object"},
                    "since": {"type": ["string", "null"]},
                    "mode": {"enum": ["fast", "full"]},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
]


def glm45_call(name: str, pairs: list[tuple[str, str]]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
    return f"<tool_call>{name}\n{body}</tool_call>"


def glm47_call(name: str, pairs: list[tuple[str, str]]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{body}</tool_call>"


def parser_factory(cls, tools=None):
    return lambda: cls(tools, make_call_id=counting_ids())


def assert_json_is_canonical(message):
    # The streamed pieces must add up to exactly what json.dumps writes.
    for call in message.tool_calls:
        value = json.loads(call.arguments_json)
        assert call.arguments_json == json.dumps(value, ensure_ascii=False)


TYPED_PAIRS = [
    ("query", "5"),
    ("limit", "20"),
    ("score", "0.75"),
    ("regex", "true"),
    ("paths", '["src/", "tests/"]'),
    ("options", '{"case": false}'),
    ("since", "null"),
    ("mode", "fast"),
]
TYPED_VALUES = {
    "query": "5",
    "limit": 20,
    "score": 0.75,
    "regex": True,
    "paths": ["src/", "tests/"],
    "options": {"case": False},
    "since": None,
    "mode": "fast",
}


@pytest.mark.parametrize(
    ("cls", "render"), [(Glm45ToolParser, glm45_call), (Glm47ToolParser, glm47_call)]
)
def test_several_calls_typed_by_schema_with_text_around(cls, render):
    code = 'def f(x):\n    return "<tool_call>" + x\t# \\ ok\n'
    text = (
        "Searching first.\n"
        + render("search.code-index", TYPED_PAIRS)
        + "\n"
        + render("write_file", [("path", "a.py"), ("content", code)])
        + "\nAll set."
    )
    message = assert_streams_like_complete(parser_factory(cls, TOOLS), text)
    assert message.errors == []
    assert message.content == "Searching first.\n\nAll set."
    assert call_summary(message) == [
        ("search.code-index", TYPED_VALUES),
        ("write_file", {"path": "a.py", "content": code}),
    ]
    assert_json_is_canonical(message)


def test_string_schema_keeps_json_looking_text_as_string():
    text = glm47_call("write_file", [("path", "123"), ("content", '{"not": "parsed"}')])
    message = Glm47ToolParser(TOOLS).parse_complete(text)
    assert call_summary(message) == [
        ("write_file", {"path": "123", "content": '{"not": "parsed"}'})
    ]


def test_schema_type_that_does_not_parse_stays_a_string():
    text = glm47_call("search.code-index", [("limit", "twenty"), ("since", "2024")])
    message = Glm47ToolParser(TOOLS).parse_complete(text)
    assert call_summary(message) == [("search.code-index", {"limit": "twenty", "since": "2024"})]


def test_values_without_a_schema_become_json_only_when_they_are_json():
    pairs = [
        ("n", "42"),
        ("neg", "-1.5e3"),
        ("flag", "false"),
        ("nothing", "null"),
        ("list", "[1, 2]"),
        ("obj", '{"a": {"b": 1}}'),
        ("quoted", '"hi"'),
        ("command", "node index.js"),
        ("word", "true story"),
        ("spaced", "  two  spaces  "),
        ("empty", ""),
        ("blank", "  "),
        ("nan", "NaN"),
        ("brace", "{not json}"),
    ]
    message = assert_streams_like_complete(parser_factory(Glm45ToolParser), glm45_call("f", pairs))
    assert call_summary(message) == [
        (
            "f",
            {
                "n": 42,
                "neg": -1500.0,
                "flag": False,
                "nothing": None,
                "list": [1, 2],
                "obj": {"a": {"b": 1}},
                "quoted": '"hi"',
                "command": "node index.js",
                "word": "true story",
                "spaced": "  two  spaces  ",
                "empty": "",
                "blank": "  ",
                "nan": "NaN",
                "brace": "{not json}",
            },
        )
    ]
    assert_json_is_canonical(message)


def test_call_without_arguments_and_names_with_dots_and_dashes():
    text = "<tool_call>git.status-short</tool_call><tool_call>ns:tool/x\n</tool_call>"
    message = assert_streams_like_complete(parser_factory(Glm47ToolParser), text)
    assert call_summary(message) == [("git.status-short", {}), ("ns:tool/x", {})]
    assert message.content == ""


def test_spaces_between_tags_are_tolerated():
    # Seen from GLM-4.5-Air under llama.cpp: spaces where the template has newlines.
    text = "Listing: <tool_call>ls <arg_key>dirPath</arg_key> <arg_value>backend</arg_value> </tool_call>"
    message = assert_streams_like_complete(parser_factory(Glm45ToolParser), text)
    assert message.content == "Listing: "
    assert call_summary(message) == [("ls", {"dirPath": "backend"})]


def test_string_values_stream_while_they_are_written():
    parser = Glm45ToolParser(TOOLS, make_call_id=lambda: "call_x")
    head = parser.feed("<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>line 1\n")
    assert head == [
        ToolCallDelta(0, "", id="call_x", name="write_file"),
        ToolCallDelta(0, '{"content": "line 1\\n'),
    ]
    assert parser.feed('say "hi"</arg_va') == [ToolCallDelta(0, 'say \\"hi\\"')]
    assert parser.feed("lue>\n</tool_call>") == [ToolCallDelta(0, '"}'), ToolCallEnd(0)]


def test_untyped_text_value_streams_once_it_cannot_be_json():
    parser = Glm47ToolParser(make_call_id=lambda: "call_x")
    head = parser.feed("<tool_call>f<arg_key>msg</arg_key><arg_value>  ")
    assert head[-1] == ToolCallDelta(0, '{"msg": '), "whitespace alone could still be JSON"
    assert parser.feed("Hello") == [ToolCallDelta(0, '"  Hello')]


MALFORMED = [
    # (text, error fragment): each call is broken in a different place.
    ("<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1", "ended"),
    (
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>a</arg_key>"
        "<arg_value>2</arg_value></tool_call>",
        "twice",
    ),
    ("<tool_call>f<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>", "expected"),
    ("<tool_call>f<arg_key>a<arg_value>1</arg_value></tool_call>", "not closed"),
    ("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>junk</tool_call>", "expected"),
    ('<tool_call>{"name": "f"}</tool_call>', "not a tool name"),
    ("<tool_call>f<arg_value>1</arg_value></tool_call>", "expected arguments"),
    ("<tool_call></tool_call>", "not a tool name"),
    ("<tool_call>f<arg_key> </arg_key><arg_value>1</arg_value></tool_call>", "empty"),
    ("<tool_call>f", "ended"),
]


@pytest.mark.parametrize(("bad", "fragment"), MALFORMED)
def test_malformed_call_is_reported_kept_as_content_and_the_next_call_survives(bad, fragment):
    good = glm47_call("g", [("x", "1")])
    ends_in_call = not bad.endswith("</tool_call>")
    text = "Before. " + bad + ("" if ends_in_call else good)
    message = assert_streams_like_complete(parser_factory(Glm47ToolParser), text)
    assert message.content == "Before. " + bad
    assert len(message.errors) == 1 and fragment in message.errors[0], message.errors
    assert call_summary(message) == ([] if ends_in_call else [("g", {"x": 1})])


def test_glm47_and_glm45_read_the_same_calls():
    pairs = [("path", "a.txt"), ("limit", "3")]
    a = Glm45ToolParser(TOOLS).parse_complete(glm45_call("write_file", pairs))
    b = Glm47ToolParser(TOOLS).parse_complete(glm47_call("write_file", pairs))
    assert call_summary(a) == call_summary(b)
