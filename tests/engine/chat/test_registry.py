"""Choosing a tool parser by name and by checkpoint."""

from __future__ import annotations

import re

import pytest

from engine.chat import TOOL_PARSERS, detect_tool_parser, get_tool_parser, new_call_id
from engine.chat.tool_parsers import (
    Glm45ToolParser,
    Glm47ToolParser,
    HermesToolParser,
    KimiK2ToolParser,
)

# The lines of the real chat templates that tell the formats apart.
GLM45_TEMPLATE = (
    "{{ '\\n<tool_call>' + tc.name }}\n{% set _args = tc.arguments %}\n"
    "{% for k, v in _args.items() %}\n<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v | tojson if v is not string else v }}</arg_value>\n{% endfor %}\n</tool_call>"
)
GLM47_TEMPLATE = (
    "{{- '<tool_call>' + tc.name -}}\n{% set _args = tc.arguments %}"
    "{% for k, v in _args.items() %}<arg_key>{{ k }}</arg_key><arg_value>"
    "{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>"
    "{% endfor %}</tool_call>"
)
KIMI_TEMPLATE = (
    "{{ '<|tool_calls_section_begin|>' }}{% for tc in message.tool_calls %}"
    "<|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>{{ tc.function.arguments }}"
    "<|tool_call_end|>{% endfor %}<|tool_calls_section_end|>"
)
DEEPSEEK_V3_TEMPLATE = "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}"
QWEN_TEMPLATE = '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'


def test_names():
    assert get_tool_parser("kimi_k2") is KimiK2ToolParser
    assert get_tool_parser("glm45") is Glm45ToolParser
    assert get_tool_parser("glm47") is Glm47ToolParser
    assert get_tool_parser("hermes") is HermesToolParser
    assert sorted(TOOL_PARSERS) == ["glm45", "glm47", "hermes", "kimi_k2"]
    with pytest.raises(ValueError, match="unknown tool parser"):
        get_tool_parser("nope")


@pytest.mark.parametrize(
    ("model_type", "template", "expected"),
    [
        ("kimi_k2", None, "kimi_k2"),
        ("kimi_k2", KIMI_TEMPLATE, "kimi_k2"),
        ("deepseek_v3", KIMI_TEMPLATE, "kimi_k2"),
        ("deepseek_v3", None, "kimi_k2"),
        ("deepseek_v3", DEEPSEEK_V3_TEMPLATE, None),
        ("glm4_moe", GLM45_TEMPLATE, "glm45"),
        ("glm4_moe", GLM47_TEMPLATE, "glm47"),
        ("glm4_moe", None, "glm45"),
        ("qwen2", QWEN_TEMPLATE, "hermes"),
        ("llama", None, "hermes"),
        ("mistral", None, None),
        ("mistral", KIMI_TEMPLATE, "kimi_k2"),
        ("glm4", GLM47_TEMPLATE, "glm47"),
        ("glm4", "plain template", None),
        ("phi3", QWEN_TEMPLATE, "hermes"),
        ("", None, None),
    ],
)
def test_detect(model_type, template, expected):
    assert detect_tool_parser(model_type, template) == expected


def test_generated_ids_look_like_openai_ids():
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


def test_glm_and_hermes_calls_get_generated_ids():
    glm = Glm47ToolParser().parse_complete("<tool_call>f</tool_call>")
    hermes = HermesToolParser().parse_complete('<tool_call>{"name": "f"}</tool_call>')
    for message in (glm, hermes):
        assert re.fullmatch(r"call_[A-Za-z0-9]{24}", message.tool_calls[0].id)
