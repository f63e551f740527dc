"""GLM-4.5 / 4.6 / 4.7 outputs, complete and in every split (see cases.py)."""

from __future__ import annotations

import pytest

from engine.chat.tool_parsers import Glm45ToolParser, Glm47ToolParser
from tests.engine.chat.cases import Case, run_case, tool


def glm47(name: str, *pairs: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{body}</tool_call>"


def glm45(name: str, *pairs: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs)
    return f"<tool_call>{name}\n{body}</tool_call>"


TOOLS = (
    tool("get_weather", {"city": {"type": "string"}, "date": {"type": "string"}}, ["city"]),
    tool("todo_write", {"todos": {"type": "array"}}, ["todos"]),
    tool(
        "create_todos",
        {"priority": {"type": "number"}, "count": {"type": "integer"}, "items": {"type": "array"}},
    ),
    tool(
        "configure",
        {
            "enabled": {"type": "boolean"},
            "meta": {"type": "object"},
            "note": {"type": ["string", "null"]},
            "retries": {"type": ["integer", "null"]},
        },
    ),
    tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
    tool("list_files"),
)
WEATHER = ("get_weather", {"city": "Beijing", "date": "2024-06-27"})
TODOS = [
    {"id": "1", "task": "Check the backend", "status": "in_progress"},
    {"id": "2", "task": "Report", "status": "pending"},
]
ESCAPED_TODOS = (
    '[{\\"id\\": \\"1\\", \\"task\\": \\"Check the backend\\", \\"status\\": \\"in_progress\\"}, '
    '{\\"id\\": \\"2\\", \\"task\\": \\"Report\\", \\"status\\": \\"pending\\"}]'
)
CODE = 'def f(x):\n    return "<tool_call>" + x\t# \\ ok\n'

# (case, GLM-4.7 only): GLM-4.5-format cases run under both parsers, since
# both read either spacing; the rest are written as GLM-4.7 writes them.
CASES = [
    Case(
        "glm47_single",
        glm47("get_weather", ("city", "Beijing"), ("date", "2024-06-27")),
        calls=(WEATHER,),
        tools=TOOLS,
    ),
    Case(
        "glm45_single_with_newlines",
        glm45("get_weather", ("city", "Beijing"), ("date", "2024-06-27")),
        calls=(WEATHER,),
        tools=TOOLS,
    ),
    Case(
        "two_calls_back_to_back",
        glm47("get_weather", ("city", "Beijing")) + glm47("get_weather", ("city", "Shanghai")),
        calls=(("get_weather", {"city": "Beijing"}), ("get_weather", {"city": "Shanghai"})),
        tools=TOOLS,
    ),
    Case(
        "text_before_and_after_with_cjk_punctuation",
        "结构：" + glm47("list_files") + "\n完成。",
        calls=(("list_files", {}),),
        content="结构：\n完成。",
        tools=TOOLS,
    ),
    Case(
        "call_without_arguments",
        glm45("list_files"),
        calls=(("list_files", {}),),
        tools=TOOLS,
        arguments_json=("{}",),
    ),
    Case(
        "values_typed_by_schema",
        glm47(
            "create_todos",
            ("priority", "5.5"),
            ("count", "10"),
            ("items", '[{"d": "a"}, {"d": "b"}]'),
        ),
        calls=(
            ("create_todos", {"priority": 5.5, "count": 10, "items": [{"d": "a"}, {"d": "b"}]}),
        ),
        tools=TOOLS,
        arguments_json=('{"priority": 5.5, "count": 10, "items": [{"d": "a"}, {"d": "b"}]}',),
    ),
    Case(
        "array_written_as_escaped_json",
        glm47("todo_write", ("todos", ESCAPED_TODOS)),
        calls=(("todo_write", {"todos": TODOS}),),
        tools=TOOLS,
    ),
    Case(
        "escaped_array_keeps_windows_backslashes",
        glm47("todo_write", ("todos", '[{\\"task\\": \\"Check C:\\\\Users\\\\test.txt\\"}]')),
        calls=(("todo_write", {"todos": [{"task": "Check C:\\Users\\test.txt"}]}),),
        tools=TOOLS,
    ),
    Case(
        "escaped_array_keeps_a_literal_backslash_n",
        glm47("todo_write", ("todos", '[{\\"task\\": \\"Print \\\\n to see\\"}]')),
        calls=(("todo_write", {"todos": [{"task": "Print \\n to see"}]}),),
        tools=TOOLS,
    ),
    Case(
        "array_quoted_as_a_json_string",
        glm47("todo_write", ("todos", '"[\\"a\\", \\"b\\"]"')),
        calls=(("todo_write", {"todos": ["a", "b"]}),),
        tools=TOOLS,
    ),
    Case(
        "python_literals_where_the_schema_wants_boolean_or_null",
        glm47("configure", ("enabled", "True"), ("retries", "None")),
        calls=(("configure", {"enabled": True, "retries": None}),),
        tools=TOOLS,
    ),
    Case(
        "nullable_string_and_nested_object",
        glm47("configure", ("note", "null"), ("meta", '{"l1": {"l2": {"l3": {"v": "deep"}}}}')),
        calls=(("configure", {"note": None, "meta": {"l1": {"l2": {"l3": {"v": "deep"}}}}}),),
        tools=TOOLS,
    ),
    Case(
        "empty_structures_and_empty_string",
        glm47("configure", ("meta", "{}"), ("note", "")) + glm47("create_todos", ("items", "[]")),
        calls=(("configure", {"meta": {}, "note": ""}), ("create_todos", {"items": []})),
        tools=TOOLS,
    ),
    Case(
        "string_schema_keeps_json_looking_text",
        glm47("write_file", ("path", "123"), ("content", '{"not": "parsed"}')),
        calls=(("write_file", {"path": "123", "content": '{"not": "parsed"}'}),),
        tools=TOOLS,
    ),
    Case(
        "code_with_tags_quotes_and_tabs",
        glm45("write_file", ("path", "a.py"), ("content", CODE)),
        calls=(("write_file", {"path": "a.py", "content": CODE}),),
        tools=TOOLS,
    ),
    Case(
        "unicode_values",
        glm47("write_file", ("path", "/tmp/データ.txt"), ("content", "naïve — ✓ 🚀")),
        calls=(("write_file", {"path": "/tmp/データ.txt", "content": "naïve — ✓ 🚀"}),),
        tools=TOOLS,
    ),
    Case(
        "untyped_values_without_tools",
        glm47(
            "f",
            ("n", "42"),
            ("flag", "false"),
            ("list", "[1, 2]"),
            ("cmd", "node index.js"),
            ("quoted", '"hi"'),
        ),
        calls=(
            (
                "f",
                {"n": 42, "flag": False, "list": [1, 2], "cmd": "node index.js", "quoted": '"hi"'},
            ),
        ),
    ),
    Case(
        "spaces_between_tags",
        "Listing: <tool_call>ls <arg_key>dir</arg_key> <arg_value>backend</arg_value> </tool_call>",
        calls=(("ls", {"dir": "backend"}),),
        content="Listing: ",
    ),
    Case(
        "namespaced_tool_name", glm47("mcp.git-status:short"), calls=(("mcp.git-status:short", {}),)
    ),
    # -- thinking ----------------------------------------------------------------------
    Case(
        "think_then_call_then_text",
        "<think>Weather first.</think>\nChecking."
        + glm47("get_weather", ("city", "Beijing"))
        + "\nDone.",
        calls=(("get_weather", {"city": "Beijing"}),),
        reasoning="Weather first.",
        content="Checking.\nDone.",
        thinking=True,
        tools=TOOLS,
    ),
    Case(
        "call_inside_unclosed_think",
        "<think>I need to think" + glm47("get_weather", ("city", "Beijing")),
        calls=(("get_weather", {"city": "Beijing"}),),
        reasoning="I need to think",
        thinking=True,
        tools=TOOLS,
    ),
    Case(
        "glm47_prompt_opened_think_then_call",
        "The user wants the weather.\n" + glm47("get_weather", ("city", "Paris")),
        calls=(("get_weather", {"city": "Paris"}),),
        reasoning="The user wants the weather.",
        thinking=True,
        starts_in_reasoning=True,
        tools=TOOLS,
    ),
    Case(
        "glm47_prompt_opened_think_then_answer",
        "short thought</think>\nThe answer.",
        reasoning="short thought",
        content="The answer.",
        thinking=True,
        starts_in_reasoning=True,
    ),
    Case(
        "two_calls_inside_unclosed_think",
        "<think>plan" + glm45("list_files") + glm47("get_weather", ("city", "Oslo")),
        calls=(("list_files", {}), ("get_weather", {"city": "Oslo"})),
        reasoning="plan",
        thinking=True,
        tools=TOOLS,
    ),
    Case(
        "late_close_after_a_call_in_think",
        "<think>plan" + glm47("list_files") + "</think>Listed.",
        calls=(("list_files", {}),),
        reasoning="plan",
        content="Listed.",
        thinking=True,
        tools=TOOLS,
    ),
    # -- malformed ---------------------------------------------------------------------
    Case(
        "argument_given_twice",
        glm47("f", ("a", "1"), ("a", "2")) + glm47("g"),
        calls=(("g", {}),),
        content=glm47("f", ("a", "1"), ("a", "2")),
        errors=("twice",),
    ),
    Case(
        "junk_between_tags_then_a_good_call",
        "Before. <tool_call>f<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>"
        + glm47("g", ("x", "1")),
        calls=(("g", {"x": 1}),),
        content="Before. <tool_call>f<arg_key>a</arg_key>oops<arg_value>1</arg_value></tool_call>",
        errors=("expected",),
    ),
    Case(
        "output_ends_inside_a_value",
        "Writing. <tool_call>write_file<arg_key>content</arg_key><arg_value>par",
        content="Writing. <tool_call>write_file<arg_key>content</arg_key><arg_value>par",
        errors=("ended",),
        tools=TOOLS,
    ),
    Case(
        "output_ends_before_the_closing_tag",
        "<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>",
        content="<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>",
        errors=("ended",),
    ),
    Case(
        "hermes_json_in_a_glm_call",
        '<tool_call>{"name": "f"}</tool_call>',
        content='<tool_call>{"name": "f"}</tool_call>',
        errors=("not a tool name",),
    ),
]


@pytest.mark.parametrize("cls", [Glm45ToolParser, Glm47ToolParser], ids=["glm45", "glm47"])
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_glm_case(case: Case, cls):
    run_case(cls, case)
