"""Hermes / Qwen outputs, complete and in every split (see cases.py)."""

from __future__ import annotations

import pytest

from engine.chat.tool_parsers import HermesToolParser
from tests.engine.chat.cases import Case, run_case


def block(body: str, newlines: bool = True) -> str:
    return f"<tool_call>\n{body}\n</tool_call>" if newlines else f"<tool_call>{body}</tool_call>"


CASES = [
    Case(
        "closing_tag_inside_a_json_string_is_argument_text",
        block(
            '{"name": "write_file", "arguments": {"content": "a </tool_call> b \\" </tool_call>"}}'
        )
        + "Done.",
        calls=(("write_file", {"content": 'a </tool_call> b " </tool_call>'}),),
        content="Done.",
    ),
    Case(
        "unterminated_string_still_ends_at_the_closing_tag_on_its_own_line",
        block('{"name": "write_file", "arguments": {"content": "oops}}') + "After.",
        content=block('{"name": "write_file", "arguments": {"content": "oops}}') + "After.",
        errors=("not valid JSON",),
    ),
    Case(
        "qwen_layout_streamed_arguments_verbatim",
        block('{"name": "final_answer", "arguments": {"trigger": true}}'),
        calls=(("final_answer", {"trigger": True}),),
        arguments_json=('{"trigger": true}',),
        ids=("call_0",),
    ),
    Case(
        "several_calls_text_around",
        "Let me look.\n"
        + block('{"name": "read_file", "arguments": {"path": "README.md"}}')
        + "\n"
        + block('{"name": "web.search-v2", "arguments": {"q": "a <tool_call> \\"b\\"", "n": 3}}')
        + "\nWaiting.",
        calls=(
            ("read_file", {"path": "README.md"}),
            ("web.search-v2", {"q": 'a <tool_call> "b"', "n": 3}),
        ),
        content="Let me look.\n\nWaiting.",
    ),
    Case(
        "no_whitespace_and_line_breaks_inside_the_object",
        block(
            '{"name":"get_temp",\n"arguments":{"location":\n"San Francisco","unit":"celsius"}}',
            newlines=False,
        ),
        calls=(("get_temp", {"location": "San Francisco", "unit": "celsius"}),),
        arguments_json=('{"location":\n"San Francisco","unit":"celsius"}',),
    ),
    Case(
        "unicode_arguments",
        block('{"name": "say", "arguments": {"text": "日本語 ✓ 🚀", "esc": "\\u00e9"}}'),
        calls=(("say", {"text": "日本語 ✓ 🚀", "esc": "é"}),),
    ),
    Case(
        "arguments_as_a_json_string",
        block('{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}'),
        calls=(("get_db_config", {"param": "max_connections"}),),
        arguments_json=('{"param": "max_connections"}',),
    ),
    Case(
        "parameters_key",
        block('{"name": "b", "parameters": {"y": "é"}}'),
        calls=(("b", {"y": "é"}),),
        arguments_json=('{"y": "é"}',),
    ),
    Case("missing_arguments", block('{"name": "now"}'), calls=(("now", {}),)),
    Case(
        "arguments_before_name",
        block('{"arguments": {"k": 1}, "name": "f"}'),
        calls=(("f", {"k": 1}),),
    ),
    Case(
        "list_of_calls_in_one_block",
        block('[{"name": "d", "arguments": {}}, {"name": "e", "arguments": {"z": null}}]'),
        calls=(("d", {}), ("e", {"z": None})),
    ),
    Case(
        "complete_call_without_closing_tag_at_end_of_output",
        'Sure. <tool_call>\n{"name": "f", "arguments": {"a": [1, 2]}}\n',
        calls=(("f", {"a": [1, 2]}),),
        content="Sure. ",
    ),
    Case(
        "qwen3_think_then_call",
        "<think>\nThe user wants the time.\n</think>\n\n"
        + block('{"name": "now", "arguments": {}}'),
        calls=(("now", {}),),
        reasoning="The user wants the time.",
        thinking=True,
    ),
    Case(
        "call_inside_unclosed_think",
        "<think>I'll check" + block('{"name": "now", "arguments": {"tz": "UTC"}}'),
        calls=(("now", {"tz": "UTC"}),),
        reasoning="I'll check",
        thinking=True,
    ),
    Case(
        "plain_text_with_tag_look_alikes",
        "1 < 2 and <tool is not a tag.",
        content="1 < 2 and <tool is not a tag.",
    ),
    # -- malformed ---------------------------------------------------------------------
    Case(
        "missing_closing_brace",
        block('{"name": "final_answer", "arguments": {"trigger": true}'),
        content=block('{"name": "final_answer", "arguments": {"trigger": true}'),
        errors=("not valid JSON",),
    ),
    Case(
        "broken_value_inside_streamed_arguments",
        block('{"name": "f", "arguments": {"a": }}', newlines=False)
        + block('{"name": "ok", "arguments": {}}'),
        calls=(("ok", {}),),
        content=block('{"name": "f", "arguments": {"a": }}', newlines=False),
        errors=("not valid JSON",),
    ),
    Case(
        "nan_in_arguments",
        block('{"name": "f", "arguments": {"x": NaN}}'),
        content=block('{"name": "f", "arguments": {"x": NaN}}'),
        errors=("not valid JSON",),
    ),
    Case(
        "name_that_is_not_a_tool_name",
        block('{"name": "rm -rf", "arguments": {}}'),
        content=block('{"name": "rm -rf", "arguments": {}}'),
        errors=("not a tool name",),
    ),
    Case(
        "arguments_that_are_an_array",
        block('{"name": "f", "arguments": [1]}'),
        content=block('{"name": "f", "arguments": [1]}'),
        errors=("JSON object",),
    ),
    Case(
        "a_second_arguments_key_contradicts_the_streamed_one",
        block('{"name": "f", "arguments": {"a": 1}, "arguments": {"a": 2}}'),
        content=block('{"name": "f", "arguments": {"a": 1}, "arguments": {"a": 2}}'),
        errors=("differs from what was streamed",),
    ),
    Case(
        "output_ends_inside_the_arguments",
        'Sure. <tool_call>{"name": "write", "arguments": {"text": "hal',
        content='Sure. <tool_call>{"name": "write", "arguments": {"text": "hal',
        errors=("ended",),
    ),
    Case("empty_list", block("[]"), content=block("[]"), errors=("empty",)),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hermes_case(case: Case):
    run_case(HermesToolParser, case)
