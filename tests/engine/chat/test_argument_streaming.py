"""When argument text is released: as it is written, and no further than it is valid."""

from __future__ import annotations

from engine.chat import ToolCallDelta, ToolCallEnd, ToolCallError
from engine.chat.tool_parsers import Glm47ToolParser, HermesToolParser, KimiK2ToolParser
from tests.engine.chat.cases import tool

S = "<|tool_calls_section_begin|>"
BEGIN, ARGS, END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
TOOLS = [
    tool("Read", {"file_path": {"type": "string"}}, ["file_path"]),
    tool("LS", {"path": {"type": "string"}}, ["path"]),
]


def fixed_id():
    return "call_x"


def test_kimi_arguments_stream_as_written():
    parser = KimiK2ToolParser(TOOLS)
    assert parser.feed(S + BEGIN + "functions.Read:0" + ARGS) == [
        ToolCallDelta(0, "", id="functions.Read:0", name="Read")
    ]
    assert parser.feed('{"file_path": "/very/') == [ToolCallDelta(0, '{"file_path": "/very/')]
    assert parser.feed('long.py"}  ') == [ToolCallDelta(0, 'long.py"}')]
    assert parser.feed(END) == [ToolCallEnd(0)]


def test_kimi_streaming_stops_at_the_first_invalid_character():
    parser = KimiK2ToolParser(TOOLS)
    parser.feed(S + BEGIN + "functions.Read:0" + ARGS)
    assert parser.feed('{"file_path": "a", oops') == [ToolCallDelta(0, '{"file_path": "a", ')]
    assert parser.feed('", "more": 1}') == [], "nothing after the error is streamed"
    events = parser.feed(END)
    assert isinstance(events[0], ToolCallError) and events[0].index == 0


def test_kimi_call_without_a_tool_name_is_announced_once_its_arguments_name_one():
    parser = KimiK2ToolParser(TOOLS)
    assert parser.feed(S + BEGIN + "call_3" + ARGS + '{"path": ') == []
    assert parser.feed('"/srv"}') == []
    assert parser.feed(END) == [
        ToolCallDelta(0, "", id="functions.LS:0", name="LS"),
        ToolCallDelta(0, '{"path": "/srv"}'),
        ToolCallEnd(0),
    ]


def test_kimi_call_without_a_tool_name_streams_when_only_one_tool_is_offered():
    parser = KimiK2ToolParser(TOOLS[:1])
    assert parser.feed(S + BEGIN + "0" + ARGS + '{"file') == [
        ToolCallDelta(0, "", id="functions.Read:0", name="Read"),
        ToolCallDelta(0, '{"file'),
    ]


def test_hermes_announces_at_the_arguments_and_streams_them():
    parser = HermesToolParser(make_call_id=fixed_id)
    assert parser.feed('<tool_call>\n{"name": "write", ') == []
    assert parser.feed('"arguments": {"text": "line 1\\n') == [
        ToolCallDelta(0, "", id="call_x", name="write"),
        ToolCallDelta(0, '{"text": "line 1\\n'),
    ]
    assert parser.feed('line 2"}}\n</tool') == [ToolCallDelta(0, 'line 2"}')]
    assert parser.feed("_call>") == [ToolCallEnd(0)]


def test_hermes_other_shapes_wait_for_the_closing_tag():
    parser = HermesToolParser(make_call_id=fixed_id)
    assert parser.feed('<tool_call>{"arguments": {"a": 1}, "name": "f"}') == []
    assert parser.feed("</tool_call>") == [
        ToolCallDelta(0, "", id="call_x", name="f"),
        ToolCallDelta(0, '{"a": 1}'),
        ToolCallEnd(0),
    ]


def test_glm_string_values_stream_and_typed_values_wait_for_their_tag():
    tools = [tool("edit", {"path": {"type": "string"}, "line": {"type": "integer"}})]
    parser = Glm47ToolParser(tools, make_call_id=fixed_id)
    assert parser.feed("<tool_call>edit<arg_key>path</arg_key><arg_value>src/ma") == [
        ToolCallDelta(0, "", id="call_x", name="edit"),
        ToolCallDelta(0, '{"path": "src/ma'),
    ]
    assert parser.feed("in.py</arg_value><arg_key>line</arg_key><arg_value>4") == [
        ToolCallDelta(0, 'in.py", "line": ')
    ]
    assert parser.feed("2</arg_value></tool_call>") == [ToolCallDelta(0, "42}"), ToolCallEnd(0)]


def test_hold_until_complete_releases_a_call_in_one_piece():
    parser = KimiK2ToolParser(TOOLS, hold_until_complete=True)
    assert parser.feed(S + BEGIN + "functions.Read:0" + ARGS + '{"file_path": "a"}') == []
    assert parser.feed(END) == [
        ToolCallDelta(0, "", id="functions.Read:0", name="Read"),
        ToolCallDelta(0, '{"file_path": "a"}'),
        ToolCallEnd(0),
    ]
