"""Kimi K2 tool calls: the format Kimi K2/K2.5/K2.6 write, streamed in every split."""

from __future__ import annotations

import json

from engine.chat import ContentDelta, ToolCallDelta, ToolCallEnd, ToolCallError
from engine.chat.tool_parsers import KimiK2ToolParser
from tests.engine.chat.streaming import (
    assert_streams_like_complete,
    call_summary,
    check_event_shape,
    run_stream,
)

BEGIN = "<|tool_calls_section_begin|>"
END = "<|tool_calls_section_end|>"


def call(header: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{header}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


def test_several_calls_with_text_before_and_after():
    text = (
        "I'll read both files."
        + BEGIN
        + call("functions.read_file:0", '{"path": "src/main.py"}')
        + call("functions.mcp.github.search-issues:1", '{"query": "fp8 \\"kv\\"", "limit": 5}')
        + END
        + "Done."
    )
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert message.content == "I'll read both files.Done."
    assert message.errors == []
    assert [c.id for c in message.tool_calls] == [
        "functions.read_file:0",
        "functions.mcp.github.search-issues:1",
    ]
    assert call_summary(message) == [
        ("read_file", {"path": "src/main.py"}),
        ("mcp.github.search-issues", {"query": 'fp8 "kv"', "limit": 5}),
    ]
    # The arguments are the model's own JSON text, not a re-serialization.
    assert message.tool_calls[1].arguments_json == '{"query": "fp8 \\"kv\\"", "limit": 5}'


def test_layout_whitespace_between_calls_and_around_arguments_is_dropped():
    text = (
        BEGIN
        + "\n"
        + call(" functions.ls:0 ", '\n  {"dir": "a b/"}  \n')
        + "\n"
        + call("functions.ls:1", '{"dir": "c"}')
        + "\n"
        + END
    )
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert message.content == ""
    assert [c.arguments_json for c in message.tool_calls] == ['{"dir": "a b/"}', '{"dir": "c"}']


def test_unicode_and_nested_arguments():
    arguments = json.dumps({"text": "naïve — 日本語 ✓", "opts": {"n": [1, 2.5, None, True]}})
    text = BEGIN + call("functions.write:0", arguments) + END
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert message.tool_calls[0].arguments_json == arguments


def test_call_without_parameters_gets_empty_object():
    message = assert_streams_like_complete(
        KimiK2ToolParser, BEGIN + call("functions.now:0", "") + END
    )
    assert call_summary(message) == [("now", {})]
    assert message.tool_calls[0].arguments_json == "{}"


def test_arguments_stream_before_the_call_ends():
    parser = KimiK2ToolParser()
    events = parser.feed(BEGIN + "<|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>")
    assert events == [ToolCallDelta(0, "", id="functions.write:0", name="write")]
    assert parser.feed('{"content": "line one\\n') == [ToolCallDelta(0, '{"content": "line one\\n')]
    assert parser.feed('line two"}<|tool_call_e') == [ToolCallDelta(0, 'line two"}')]
    assert parser.feed("nd|>") == [ToolCallEnd(0)]
    assert parser.finish() == []


def test_malformed_json_is_reported_and_kept_as_content_without_markers():
    bad = call("functions.edit:1", '{"path": "a.py", "old": ')
    text = "Fixing." + BEGIN + call("functions.read:0", '{"path": "a.py"}') + bad + END
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert call_summary(message) == [("read", {"path": "a.py"})]
    # The markers are special tokens: never content, even from a broken call.
    assert message.content == 'Fixing.functions.edit:1{"path": "a.py", "old": '
    assert len(message.errors) == 1 and "invalid JSON" in message.errors[0]

    events = run_stream(KimiK2ToolParser(), [text])
    errors = [e for e in events if isinstance(e, ToolCallError)]
    assert [e.index for e in errors] == [1], "the announced call is voided by index"


def test_arguments_that_are_not_an_object_are_malformed():
    message = KimiK2ToolParser().parse_complete(BEGIN + call("functions.f:0", "[1, 2]") + END)
    assert message.tool_calls == []
    assert "JSON object" in message.errors[0]


def test_missing_end_tag_at_end_of_output_with_complete_json_is_a_call():
    text = "ok" + BEGIN + '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1}'
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert call_summary(message) == [("f", {"a": 1})]
    assert message.content == "ok" and message.errors == []


def test_output_ending_inside_the_arguments():
    text = "ok" + BEGIN + '<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": 1'
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert message.tool_calls == []
    assert message.content == 'okfunctions.f:0{"a": 1'
    assert "ended" in message.errors[0]


def test_output_ending_inside_a_header():
    text = BEGIN + "<|tool_call_begin|>functions.f"
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert message.tool_calls == [] and message.content == "functions.f"
    assert len(message.errors) == 1


def test_header_cut_short_by_the_next_call_then_a_good_call():
    text = BEGIN + "<|tool_call_begin|>functions.f:0" + call("functions.g:1", "{}") + END
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert call_summary(message) == [("g", {})]
    assert message.content == "functions.f:0"
    assert "no arguments" in message.errors[0]


def test_call_without_argument_marker_is_a_call_without_parameters():
    text = BEGIN + "<|tool_call_begin|>functions.now:0<|tool_call_end|>" + END
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert call_summary(message) == [("now", {})] and message.errors == []


def test_header_that_names_no_tool_and_no_tools_to_match_is_dropped():
    bad = call("functions.not a name:0", '{"a": 1}')
    message = assert_streams_like_complete(KimiK2ToolParser, BEGIN + bad + END)
    assert message.tool_calls == [] and message.content == 'functions.not a name:0{"a": 1}'
    assert "names no tool" in message.errors[0]


def test_stray_text_in_section_is_reported_once_and_kept():
    text = BEGIN + "hmm, let me think" + call("functions.f:0", "{}") + END
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert call_summary(message) == [("f", {})]
    assert message.content == "hmm, let me think"
    assert len(message.errors) == 1


def test_unclosed_section_after_complete_calls_is_fine():
    message = assert_streams_like_complete(KimiK2ToolParser, BEGIN + call("functions.f:0", "{}"))
    assert call_summary(message) == [("f", {})] and message.errors == []


def test_unnumbered_header_gets_kimi_style_id():
    message = KimiK2ToolParser().parse_complete(BEGIN + call("functions.f", "{}") + END)
    assert message.tool_calls[0].id == "functions.f:0"


def test_text_that_only_looks_like_a_marker_start_is_content():
    text = "a <|tool maybe <|tool_calls_section_beg"
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert message.content == text and message.tool_calls == [] and message.errors == []


def test_hold_until_complete_never_announces_a_malformed_call():
    bad = call("functions.bad:0", "{oops")
    text = BEGIN + bad + call("functions.good:1", '{"x": 1}') + END
    for chunks in ([text], list(text)):
        parser = KimiK2ToolParser(hold_until_complete=True)
        events = run_stream(parser, chunks)
        check_event_shape(events)
        deltas = [e for e in events if isinstance(e, ToolCallDelta)]
        assert {e.index for e in deltas} == {0}, "the good call takes index 0"
        assert deltas[0].name == "good"
        assert [e.index for e in events if isinstance(e, ToolCallError)] == [None]
        assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == (
            "functions.bad:0{oops"
        )


def test_call_without_a_section_is_read_and_text_after_it_is_content():
    text = "Reading." + call("functions.read:0", '{"p": 1}') + " Then more text."
    message = assert_streams_like_complete(KimiK2ToolParser, text)
    assert call_summary(message) == [("read", {"p": 1})]
    assert message.content == "Reading. Then more text."
    assert message.errors == []


def test_header_of_unicode_digits_is_read_without_crashing():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for header in ("²", "٣", "call_²"):
        text = BEGIN + call(header, "{}") + END
        message = assert_streams_like_complete(lambda: KimiK2ToolParser(tools), text)
        assert call_summary(message) == [("f", {})], header
