"""Kimi K2 / K2.5 / K2.6 outputs, complete and in every split (see cases.py)."""

from __future__ import annotations

import pytest

from engine.chat.tool_parsers import KimiK2ToolParser
from tests.engine.chat.cases import Case, run_case, tool

S, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS, CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)


def call(header: str, arguments: str) -> str:
    return f"{CALL_BEGIN}{header}{ARGS}{arguments}{CALL_END}"


def section(*calls: str) -> str:
    return S + "".join(calls) + E


# An agent's tool set, where argument names are shared between tools.
TOOLS = (
    tool("Read", {"file_path": {"type": "string"}, "limit": {"type": "integer"}}, ["file_path"]),
    tool(
        "Write",
        {"file_path": {"type": "string"}, "content": {"type": "string"}},
        ["file_path", "content"],
    ),
    tool("Glob", {"pattern": {"type": "string"}, "path": {"type": "string"}}, ["pattern"]),
    tool(
        "Grep",
        {
            "pattern": {"type": "string"},
            "path": {"type": "string"},
            "output_mode": {"enum": ["content", "files_with_matches"]},
        },
        ["pattern"],
    ),
    tool(
        "LS",
        {"path": {"type": "string"}, "ignore": {"type": "array", "items": {"type": "string"}}},
        ["path"],
    ),
    tool(
        "get_weather",
        {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        ["city"],
    ),
    tool("Ping"),
)
READ = call("functions.Read:0", '{"file_path": "/src/main.py"}')

CASES = [
    Case(
        "end_marker_inside_a_json_string_is_argument_text",
        section(
            call("functions.Write:0", '{"file_path": "m.md", "content": "a <|tool_call_end|> b"}')
        ),
        calls=(("Write", {"file_path": "m.md", "content": "a <|tool_call_end|> b"}),),
        tools=TOOLS,
    ),
    # -- the format as Kimi writes it ---------------------------------------------------------
    Case(
        "single",
        section(READ),
        calls=(("Read", {"file_path": "/src/main.py"}),),
        ids=("functions.Read:0",),
    ),
    Case(
        "two_calls_text_around",
        "Reading both."
        + section(READ, call("functions.get_weather:1", '{"city": "Tokyo"}'))
        + " Done.",
        calls=(("Read", {"file_path": "/src/main.py"}), ("get_weather", {"city": "Tokyo"})),
        content="Reading both. Done.",
    ),
    Case(
        "model_counter_continues_across_turns",
        section(
            call("functions.get_weather:7", '{"city": "Oslo"}'),
            call("functions.get_weather:8", '{"city": "Rome"}'),
        ),
        calls=(("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})),
        ids=("functions.get_weather:7", "functions.get_weather:8"),
    ),
    Case(
        "two_sections_with_text_between",
        "A:" + section(READ) + " then B: " + section(call("functions.LS:1", '{"path": "/"}')),
        calls=(("Read", {"file_path": "/src/main.py"}), ("LS", {"path": "/"})),
        content="A: then B: ",
    ),
    Case(
        "call_without_section",
        "Checking." + call("functions.Ping:0", "{}") + " Waiting.",
        calls=(("Ping", {}),),
        content="Checking. Waiting.",
    ),
    Case(
        "singular_section_spelling",
        "<|tool_call_section_begin|>" + READ + "<|tool_call_section_end|>",
        calls=(("Read", {"file_path": "/src/main.py"}),),
    ),
    Case(
        "layout_whitespace",
        S + "\n " + call(" functions.LS:0 ", '\n  {"path": "a b/"}  \n') + "\n" + E + "\n",
        calls=(("LS", {"path": "a b/"}),),
        arguments_json=('{"path": "a b/"}',),
    ),
    Case(
        "unicode_everywhere",
        "日本語で説明します。"
        + section(
            call("functions.Write:0", '{"file_path": "/tmp/ü.txt", "content": "héllo ✓ 🚀"}')
        ),
        calls=(("Write", {"file_path": "/tmp/ü.txt", "content": "héllo ✓ 🚀"}),),
        content="日本語で説明します。",
    ),
    Case(
        "nested_and_escaped_arguments_kept_verbatim",
        section(
            call(
                "functions.mcp__gh__search-issues:0",
                '{"q": "fp8 \\"kv\\"", "opts": {"n": [1, 2.5e-3, null, true]}}',
            )
        ),
        calls=(
            ("mcp__gh__search-issues", {"q": 'fp8 "kv"', "opts": {"n": [1, 2.5e-3, None, True]}}),
        ),
        arguments_json=('{"q": "fp8 \\"kv\\"", "opts": {"n": [1, 2.5e-3, null, true]}}',),
    ),
    Case(
        "marker_text_inside_a_json_string_is_argument_text",
        section(
            call(
                "functions.Write:0",
                '{"file_path": "k.md", "content": "use <|tool_call_begin|> here"}',
            )
        ),
        calls=(("Write", {"file_path": "k.md", "content": "use <|tool_call_begin|> here"}),),
    ),
    Case(
        "empty_arguments",
        section(call("functions.Ping:0", "  ")),
        calls=(("Ping", {}),),
        arguments_json=("{}",),
    ),
    Case(
        "no_argument_marker",
        S + CALL_BEGIN + "functions.Ping:0" + CALL_END + E,
        calls=(("Ping", {}),),
    ),
    # -- thinking (K2 thinking, K2.5, K2.6) --------------------------------------------------
    Case(
        "think_closed_then_call",
        "<think>I need the file.</think>" + section(READ),
        calls=(("Read", {"file_path": "/src/main.py"}),),
        reasoning="I need the file.",
        thinking=True,
    ),
    Case(
        "call_inside_unclosed_think",
        "<think>Let me read this file..."
        + section(call("functions.ReadFile:0", '{"path": "/test.py"}')),
        calls=(("ReadFile", {"path": "/test.py"}),),
        reasoning="Let me read this file...",
        thinking=True,
    ),
    Case(
        "call_inside_think_the_prompt_opened",
        "I should list it first.\n" + section(call("functions.LS:3", '{"path": "/srv"}')),
        calls=(("LS", {"path": "/srv"}),),
        reasoning="I should list it first.",
        thinking=True,
        starts_in_reasoning=True,
    ),
    Case(
        "call_right_after_think_open",
        "<think>" + section(READ),
        calls=(("Read", {"file_path": "/src/main.py"}),),
        thinking=True,
    ),
    Case(
        "two_calls_inside_unclosed_think",
        "<think>Both files." + S + READ + call("functions.Read:1", '{"file_path": "/b.py"}') + E,
        calls=(("Read", {"file_path": "/src/main.py"}), ("Read", {"file_path": "/b.py"})),
        reasoning="Both files.",
        thinking=True,
    ),
    Case(
        "call_inside_think_then_late_close_and_answer",
        "<think>Check first." + section(READ) + "</think>I checked.",
        calls=(("Read", {"file_path": "/src/main.py"}),),
        reasoning="Check first.",
        content="I checked.",
        thinking=True,
    ),
    Case(
        "bare_call_inside_unclosed_think",
        "<think>quick look" + call("functions.Ping:0", "{}"),
        calls=(("Ping", {}),),
        reasoning="quick look",
        thinking=True,
    ),
    # -- headers that name no tool: ids a client rewrote ----------------------------------
    Case(
        "bare_counter_resolved_by_arguments",
        section(call("0", '{"city": "Tokyo"}')),
        calls=(("get_weather", {"city": "Tokyo"}),),
        tools=TOOLS,
        ids=("functions.get_weather:0",),
    ),
    Case(
        "client_call_id_resolved_by_required_keys",
        section(call("call_3", '{"file_path": "/x", "content": "c"}')),
        calls=(("Write", {"file_path": "/x", "content": "c"}),),
        tools=TOOLS,
        ids=("functions.Write:0",),
    ),
    Case(
        "anthropic_style_id",
        section(
            call("toolu_01AkmjoowNgNx2qNfJzc8z2F", '{"pattern": "TODO", "output_mode": "content"}')
        ),
        calls=(("Grep", {"pattern": "TODO", "output_mode": "content"}),),
        tools=TOOLS,
    ),
    Case(
        "uuid_id_and_standard_header_mixed",
        section(
            call("0b3d1c2e-4f5a-6b7c-8d9e-0f1a2b3c4d5e", '{"path": "/srv"}'),
            call("functions.Read:7", '{"file_path": "/a.py"}'),
        ),
        calls=(("LS", {"path": "/srv"}), ("Read", {"file_path": "/a.py"})),
        tools=TOOLS,
        ids=("functions.LS:0", "functions.Read:7"),
    ),
    Case(
        "empty_object_names_the_tool_without_parameters",
        section(call("call_9", "{}")),
        calls=(("Ping", {}),),
        tools=TOOLS,
    ),
    Case(
        "name_with_counter_but_no_prefix",
        section(call("Read:2", '{"file_path": "/y"}')),
        calls=(("Read", {"file_path": "/y"}),),
        tools=TOOLS,
        ids=("functions.Read:2",),
    ),
    Case(
        "ambiguous_arguments_drop_the_call_and_the_next_survives",
        section(call("call_3", '{"pattern": "a", "path": "/x"}'), call("call_4", '{"path": "/y"}')),
        calls=(("LS", {"path": "/y"}),),
        content='call_3{"pattern": "a", "path": "/x"}',
        errors=("fit several tools (Glob, Grep)",),
        tools=TOOLS,
    ),
    Case(
        "arguments_fitting_no_tool_drop_the_call",
        "x" + section(call("weird@id", '{"bogus": 1}')),
        content='xweird@id{"bogus": 1}',
        errors=("fit none",),
        tools=TOOLS,
    ),
    Case(
        "wrong_value_type_fits_no_tool",
        section(call("call_1", '{"file_path": 5}')),
        content='call_1{"file_path": 5}',
        errors=("fit none",),
        tools=TOOLS,
    ),
    Case(
        "enum_rules_a_tool_out",
        section(call("call_1", '{"city": "Oslo", "unit": "kelvin"}')),
        content='call_1{"city": "Oslo", "unit": "kelvin"}',
        errors=("fit none",),
        tools=TOOLS,
    ),
    Case(
        "single_tool_needs_no_matching",
        section(call("call_5", '{"anything": true}')),
        calls=(("get_weather", {"anything": True}),),
        tools=(TOOLS[5],),
        ids=("functions.get_weather:0",),
    ),
    Case(
        "no_tools_cannot_name_a_bare_counter",
        section(call("3", '{"x": 1}')),
        content='3{"x": 1}',
        errors=("no tools",),
        tools=(),
    ),
    # -- stray and missing markers -------------------------------------------------------
    Case("stray_section_end_in_text", "All done.<|tool_calls_section_end|>", content="All done."),
    Case("stray_call_markers_in_text", "a" + ARGS + "b" + CALL_END + "c", content="abc"),
    Case(
        "repeated_section_begin_and_stray_end",
        S + S + READ + CALL_END + E + E,
        calls=(("Read", {"file_path": "/src/main.py"}),),
    ),
    Case(
        "repeated_argument_marker",
        section(CALL_BEGIN + "functions.Ping:0" + ARGS + ARGS + "{}" + CALL_END),
        calls=(("Ping", {}),),
    ),
    Case(
        "missing_call_end_before_the_next_call",
        S
        + CALL_BEGIN
        + "functions.LS:0"
        + ARGS
        + '{"path": "/a"}'
        + call("functions.LS:1", '{"path": "/b"}')
        + E,
        calls=(("LS", {"path": "/a"}), ("LS", {"path": "/b"})),
    ),
    Case(
        "missing_call_end_before_the_section_end",
        S + CALL_BEGIN + "functions.LS:0" + ARGS + '{"path": "/a"}' + E + "ok",
        calls=(("LS", {"path": "/a"}),),
        content="ok",
    ),
    Case(
        "missing_call_end_at_end_of_output",
        S + CALL_BEGIN + "functions.LS:0" + ARGS + '{"path": "/a"} ',
        calls=(("LS", {"path": "/a"}),),
    ),
    # -- malformed calls: reported, given back as text, never a crash ---------------------
    Case(
        "malformed_json_then_a_good_call",
        "Fixing." + section(call("functions.Edit:1", '{"path": "a.py", "old": '), READ),
        calls=(("Read", {"file_path": "/src/main.py"}),),
        content='Fixing.functions.Edit:1{"path": "a.py", "old": ',
        errors=("invalid JSON",),
    ),
    Case(
        "misspelled_literal",
        section(call("functions.get_weather:1", '{"city": "Bad", "valid": fasle}')),
        content='functions.get_weather:1{"city": "Bad", "valid": fasle}',
        errors=("invalid JSON",),
    ),
    Case(
        "python_dict_is_not_json",
        section(call("functions.Read:0", "{'file_path': 'x.txt'}")),
        content="functions.Read:0{'file_path': 'x.txt'}",
        errors=("invalid JSON",),
    ),
    Case(
        "nan_is_not_json",
        section(call("functions.f:0", '{"x": NaN}')),
        content='functions.f:0{"x": NaN}',
        errors=("invalid JSON",),
    ),
    Case(
        "arguments_not_an_object",
        section(call("functions.f:0", "[1, 2]")),
        content="functions.f:0[1, 2]",
        errors=("JSON object",),
    ),
    Case(
        "output_ends_inside_arguments",
        "ok" + S + CALL_BEGIN + "functions.Write:0" + ARGS + '{"file_path": "a", "content": "par',
        content='okfunctions.Write:0{"file_path": "a", "content": "par',
        errors=("ended inside the arguments",),
    ),
    Case(
        "output_ends_inside_header",
        S + CALL_BEGIN + "functions.Wri",
        content="functions.Wri",
        errors=("ended inside",),
    ),
    Case(
        "stray_text_inside_section",
        S + "hmm, let me see" + call("functions.Ping:0", "{}") + E,
        calls=(("Ping", {}),),
        content="hmm, let me see",
        errors=("unexpected text",),
    ),
    Case(
        "marker_look_alikes_are_text",
        "a <|tool maybe <|tool_calls_section_beg",
        content="a <|tool maybe <|tool_calls_section_beg",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_kimi_case(case: Case):
    run_case(KimiK2ToolParser, case)
