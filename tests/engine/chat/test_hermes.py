"""Hermes / Qwen JSON tool calls."""

from __future__ import annotations

import pytest

from engine.chat.tool_parsers import HermesToolParser
from tests.engine.chat.streaming import assert_streams_like_complete, call_summary, counting_ids


def make_parser():
    return HermesToolParser(make_call_id=counting_ids())


def test_several_calls_with_text_before_and_after():
    # As Qwen2.5's template renders them: one block per call, newlines inside.
    text = (
        "Let me look.\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "README.md"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "web.search-v2", "arguments": {"q": "a <tool_call> \\"b\\"", '
        '"n": 3}}\n</tool_call>\n'
        "Waiting for results."
    )
    message = assert_streams_like_complete(make_parser, text)
    assert message.errors == []
    assert message.content == "Let me look.\n\nWaiting for results."
    assert call_summary(message) == [
        ("read_file", {"path": "README.md"}),
        ("web.search-v2", {"q": 'a <tool_call> "b"', "n": 3}),
    ]
    assert [c.id for c in message.tool_calls] == ["call_0", "call_1"]


def test_accepted_variants():
    text = (
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>{"name": "b", "parameters": {"y": "é"}}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
        '<tool_call>[{"name": "d", "arguments": {}}, {"name": "e", "arguments": {"z": null}}]'
        "</tool_call>"
    )
    message = assert_streams_like_complete(make_parser, text)
    assert call_summary(message) == [
        ("a", {"x": 1}),
        ("b", {"y": "é"}),
        ("c", {}),
        ("d", {}),
        ("e", {"z": None}),
    ]
    assert message.tool_calls[1].arguments_json == '{"y": "é"}'


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ('<tool_call>{"name": "f", "arguments": {"a": }</tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "not a tool name"),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>', "not JSON"),
        ('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>', "not valid JSON"),
        ("<tool_call>[]</tool_call>", "empty"),
        ('<tool_call>"f"</tool_call>', "JSON object"),
    ],
)
def test_malformed_call_is_reported_and_kept_as_content(bad, fragment):
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    message = assert_streams_like_complete(make_parser, "x " + bad + good)
    assert message.content == "x " + bad
    assert call_summary(message) == [("ok", {})]
    assert len(message.errors) == 1 and fragment in message.errors[0], message.errors


def test_missing_end_tag_at_end_of_output():
    # Complete JSON at the end of output is a call: servers often stop at </tool_call>.
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}'
    message = assert_streams_like_complete(make_parser, text)
    assert call_summary(message) == [("f", {"a": 1})]
    assert message.content == "Sure. " and message.errors == []
    # Cut inside the JSON, it is not.
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}'
    message = assert_streams_like_complete(make_parser, text)
    assert message.tool_calls == []
    assert message.content == text
    assert "ended" in message.errors[0]


def test_plain_text_is_untouched():
    text = "No tools needed: 1 < 2 and <tool is not a tag."
    message = assert_streams_like_complete(make_parser, text)
    assert message.content == text and message.tool_calls == [] and message.errors == []
