"""Event shapes for the server, and reasoning + tool calls chained."""

from __future__ import annotations

import json

from engine.chat import (
    ChatOutputParser,
    ContentDelta,
    ReasoningDelta,
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    collect_events,
)
from engine.chat.tool_parsers import Glm47ToolParser, KimiK2ToolParser
from tests.engine.chat.streaming import counting_ids, every_chunking


def test_openai_shapes():
    assert ToolCallDelta(0, "", id="call_1", name="f").to_openai() == {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": ""},
    }
    assert ToolCallDelta(2, '{"a"').to_openai() == {"index": 2, "function": {"arguments": '{"a"'}}
    assert ToolCall("call_1", "f", "{}").to_openai() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }


def test_collect_keeps_only_completed_calls():
    events = [
        ContentDelta("a"),
        ToolCallDelta(0, "", id="x", name="f"),
        ToolCallDelta(0, "{}"),
        ToolCallEnd(0),
        ToolCallDelta(1, "", id="y", name="g"),
        ToolCallDelta(1, "{"),
        ToolCallError("g: broken", 1),
        ContentDelta("raw"),
        ToolCallDelta(2, "", id="z", name="h"),  # never ended: an output cut short
    ]
    message = collect_events(events)
    assert message.content == "araw"
    assert message.tool_calls == [ToolCall("x", "f", "{}")]
    assert message.errors == ["g: broken"]


def test_feed_after_finish_is_a_programming_error():
    parser = KimiK2ToolParser()
    parser.finish()
    try:
        parser.feed("x")
    except RuntimeError:
        pass
    else:
        raise AssertionError("feed after finish must raise")


def chain(starts_in_reasoning=False):
    return ChatOutputParser(
        Glm47ToolParser(make_call_id=counting_ids()), ReasoningParser(starts_in_reasoning)
    )


def test_reasoning_then_tool_call_in_every_split():
    text = (
        "<think>Need the file.</think>\nReading it."
        "<tool_call>read_file<arg_key>path</arg_key><arg_value>a.py</arg_value></tool_call>"
    )
    expected = chain().parse_complete(text)
    assert expected.reasoning_content == "Need the file."
    assert expected.content == "Reading it."
    assert [(c.name, json.loads(c.arguments_json)) for c in expected.tool_calls] == [
        ("read_file", {"path": "a.py"})
    ]
    for chunks in every_chunking(text):
        parser = chain()
        events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
        kinds = [type(e) for e in events]
        # Order as written: reasoning, then content, then the call.
        assert kinds.index(ReasoningDelta) < kinds.index(ContentDelta) < kinds.index(ToolCallDelta)
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        message = collect_events(e for e in events if not isinstance(e, ReasoningDelta))
        assert reasoning == expected.reasoning_content, chunks
        assert message.content == expected.content, chunks
        assert message.tool_calls == expected.tool_calls, chunks


def test_a_tool_call_ends_open_reasoning_and_the_late_close_tag_is_dropped():
    # GLM and Kimi K2.5+ call tools while still thinking; the markers are special
    # tokens, so a call marker inside <think> is a call, not prose about one.
    text = "<think>maybe <tool_call>f</tool_call>?</think>No call."
    expected = chain().parse_complete(text)
    assert expected.reasoning_content == "maybe"
    assert [c.name for c in expected.tool_calls] == ["f"]
    assert expected.content == "?No call."
    for chunks in every_chunking(text):
        parser = chain()
        events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        message = collect_events(e for e in events if not isinstance(e, ReasoningDelta))
        assert (reasoning, message.content) == ("maybe", "?No call."), chunks
        assert message.tool_calls == expected.tool_calls, chunks


def test_only_the_first_late_close_tag_is_dropped_and_only_after_open_reasoning():
    text = "<think>a<tool_call>f</tool_call>b</think>c</think>d"
    assert chain().parse_complete(text).content == "bc</think>d"
    closed = "<think>a</think>b<tool_call>f</tool_call>c</think>d"
    assert chain().parse_complete(closed).content == "bc</think>d"


def test_either_parser_may_be_absent():
    only_tools = ChatOutputParser(Glm47ToolParser(make_call_id=counting_ids()))
    message = only_tools.parse_complete("<think>x</think><tool_call>f</tool_call>")
    assert message.content == "<think>x</think>" and message.reasoning_content is None
    only_reasoning = ChatOutputParser(reasoning_parser=ReasoningParser())
    message = only_reasoning.parse_complete("<think>x</think><tool_call>f</tool_call>")
    assert message.reasoning_content == "x"
    assert message.content == "<tool_call>f</tool_call>" and message.tool_calls == []
    neither = ChatOutputParser()
    assert neither.feed("a") + neither.feed("b") + neither.finish() == [
        ContentDelta("a"),
        ContentDelta("b"),
    ]
