"""Chat formats of the new families: GLM-5.x (glm_moe_dsa), DeepSeek V3.2, Kimi Linear, Kimi K3.

What the formats are, with the sources the choice rests on:

- GLM-5.x writes GLM-4.7's tool calls (`<tool_call>NAME<arg_key>k</arg_key>
  <arg_value>v</arg_value></tool_call>`, no newlines) and `<think>` reasoning
  opened by the generation prompt: vLLM's GLM-5.1 recipe serves it with
  `--tool-call-parser glm47 --reasoning-parser glm45`, and SGLang registers its
  `glm5` parser as the GLM-4.7 detector (sgl-project/sglang#19925).
- Kimi Linear's released template writes Kimi K2's sections and markers, so it
  is read by the K2 parser.
- DeepSeek V3.2 writes DSML (`<｜DSML｜function_calls>`) and Kimi K3 XTML
  (`<|open|>call tool="..."<|sep|>`); no parser here reads either, so their
  requests with tools get text tools, never a parser that would find nothing.

The outputs below are written in each model's real format and fed whole and in
every chunking through the parser the renderer picks, reasoning included.
"""

from __future__ import annotations

import json

import pytest

from engine.chat import ContentDelta, ReasoningDelta, ToolCallError, collect_events
from engine.chat.tool_text import read_model_type
from engine.devtools.testing.chat_templates import GLM45_TEMPLATE
from engine.devtools.testing.tokenizers import save_glm_tokenizer, save_kimi_tokenizer
from engine.rendering import ChatRenderer
from engine.rendering.renderer import RenderedChat
from tests.engine.chat.streaming import every_chunking

# GLM-4.7's layout, which GLM-5 shares: no newline around <arg_key>/<arg_value>, and
# the generation prompt opens <think> unless thinking is switched off.
GLM5_TEMPLATE = (
    GLM45_TEMPLATE.replace("\\n<arg_key>", "<arg_key>")
    .replace("</arg_key>\\n<arg_value>", "</arg_key><arg_value>")
    .replace(
        "{%- if add_generation_prompt -%}<|assistant|>"
        "{%- if enable_thinking is defined and not enable_thinking -%}{{- '\\n<think></think>' -}}"
        "{%- endif -%}",
        "{%- if add_generation_prompt -%}<|assistant|>"
        "{{- '</think>' if (enable_thinking is defined and not enable_thinking) else '<think>' -}}",
    )
)
# The lines of DeepSeek V3.2's and Kimi K3's templates that name their call formats.
DSML_TEMPLATE = (
    '{%- set dsml_token = "｜DSML｜" -%}{%- if tools -%}<{{ dsml_token }}function_calls>'
    '<{{ dsml_token }}invoke name="$FUNCTION_NAME">{%- endif -%}</think>'
)
XTML_TEMPLATE = (
    "{%- macro open_tag(tag) -%}{{- '<|open|>' + tag + '<|sep|>' -}}{%- endmacro -%}"
    "{%- macro close_tag(tag) -%}{{- '<|close|>' + tag + '<|sep|>' -}}{%- endmacro -%}"
    "{%- if tools -%}{{- open_tag('tools') -}}{{- close_tag('tools') -}}{%- endif -%}"
)
GLM47_LINES = "{{- '<tool_call>' + tc.name -}}<arg_key>{{ k }}</arg_key><arg_value>"
GLM45_LINES = "{{ '\\n<tool_call>' + tc.name }}\n<arg_key>{{ k }}</arg_key>\n<arg_value>"
KIMI_LINES = "<|tool_calls_section_begin|><|tool_call_begin|>{{ tc.id }}"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "options": {"type": "object"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]
ASK = [{"role": "user", "content": "list the files"}]


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    return save_glm_tokenizer(tmp_path_factory.mktemp("glm5"))


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return save_kimi_tokenizer(tmp_path_factory.mktemp("kimi_linear"))


@pytest.mark.parametrize(
    ("model_type", "template", "expected"),
    [
        ("glm_moe_dsa", GLM5_TEMPLATE, "glm47"),
        ("glm_moe_dsa", GLM47_LINES, "glm47"),
        ("glm_moe_dsa", None, "glm47"),  # GLM-5's own format when the template says nothing
        ("glm_moe_dsa", GLM45_LINES, "glm45"),  # a fine-tune's template still decides
        ("deepseek_v32", DSML_TEMPLATE, None),
        ("deepseek_v32", GLM47_LINES, "glm47"),  # GLM-5 conversions labelled deepseek_v32
        ("deepseek_v32", None, None),
        ("kimi_linear", KIMI_LINES, "kimi_k2"),
        ("kimi_linear", None, "kimi_k2"),
        ("kimi_linear", XTML_TEMPLATE, None),  # K3's text_config is kimi_linear
        ("kimi_k3", XTML_TEMPLATE, None),
        ("kimi_k3", KIMI_LINES, "kimi_k2"),
    ],
)
def test_detect_new_families(model_type, template, expected):
    from engine.chat import detect_tool_parser

    assert detect_tool_parser(model_type, template) == expected


def test_model_type_of_kimi_k3_is_its_text_models(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "kimi_k3", "text_config": {"model_type": "kimi_linear"}})
    )
    assert read_model_type(tmp_path) == "kimi_linear"


def _stream(prompt: RenderedChat, chunks: list[str]):
    parser = prompt.output_parser()
    events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    message = collect_events(e for e in events if not isinstance(e, ReasoningDelta))
    return reasoning or None, message, events


def parse_every_way(prompt: RenderedChat, text: str):
    """The complete parse, checked to equal the stream folded, however the text is split."""
    complete = prompt.parse(text)
    for chunks in every_chunking(text):
        reasoning, message, _ = _stream(prompt, chunks)
        assert reasoning == complete.reasoning_content, f"chunks={chunks!r}"
        assert message.content == complete.content, f"chunks={chunks!r}"
        # GLM's call ids are random per parser: compare what was called.
        assert calls(message) == calls(complete), f"chunks={chunks!r}"
        assert message.errors == complete.errors, f"chunks={chunks!r}"
    return complete


def calls(message) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments_json)) for call in message.tool_calls]


def test_glm5_prompt_picks_glm47_and_opens_reasoning(glm):
    prompt = ChatRenderer(glm, "glm_moe_dsa", GLM5_TEMPLATE).render(ASK, TOOLS)
    assert prompt.tool_parser == "glm47"
    assert prompt.reasoning and prompt.starts_in_reasoning
    assert prompt.text.endswith("<|assistant|><think>")
    off = ChatRenderer(glm, "glm_moe_dsa", GLM5_TEMPLATE).render(
        ASK, TOOLS, template_kwargs={"enable_thinking": False}
    )
    assert off.text.endswith("<|assistant|></think>") and not off.starts_in_reasoning


def test_glm5_answer_with_reasoning_text_and_two_calls(glm):
    prompt = ChatRenderer(glm, "glm_moe_dsa", GLM5_TEMPLATE).render(ASK, TOOLS)
    text = (
        "The user wants a listing.</think>Listing them."
        "<tool_call>Bash<arg_key>command</arg_key><arg_value>ls -la</arg_value>"
        "<arg_key>timeout</arg_key><arg_value>30</arg_value></tool_call>"
        "<tool_call>read<arg_key>path</arg_key><arg_value>a.py</arg_value></tool_call>"
    )
    message = parse_every_way(prompt, text)
    assert message.reasoning_content == "The user wants a listing."
    assert message.content == "Listing them."
    assert calls(message) == [
        ("Bash", {"command": "ls -la", "timeout": 30}),
        ("read", {"path": "a.py"}),
    ]
    assert message.errors == []


def test_glm5_call_opened_while_still_thinking_ends_the_reasoning(glm):
    prompt = ChatRenderer(glm, "glm_moe_dsa", GLM5_TEMPLATE).render(ASK, TOOLS)
    text = "I will list them\n<tool_call>Bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call>"
    message = parse_every_way(prompt, text)
    assert message.reasoning_content == "I will list them"
    assert calls(message) == [("Bash", {"command": "ls"})]


def test_glm5_broken_json_value_is_kept_verbatim_for_schema_validation(glm):
    # GLM writes values as text, not JSON: an object value that does not parse stays
    # the text the model wrote, so the agent's argument validation names the problem.
    prompt = ChatRenderer(glm, "glm_moe_dsa", GLM5_TEMPLATE).render(ASK, TOOLS)
    text = (
        "</think><tool_call>Bash<arg_key>command</arg_key><arg_value>ls</arg_value>"
        '<arg_key>options</arg_key><arg_value>{"recursive": tru</arg_value></tool_call>'
    )
    message = parse_every_way(prompt, text)
    assert calls(message) == [("Bash", {"command": "ls", "options": '{"recursive": tru'})]


def test_glm5_malformed_call_is_an_error_and_its_text_stays(glm):
    prompt = ChatRenderer(glm, "glm_moe_dsa", GLM5_TEMPLATE).render(ASK, TOOLS)
    broken = "<tool_call>Bash<arg_key>command</arg_key>ls -la</tool_call>"
    good = "<tool_call>read<arg_key>path</arg_key><arg_value>a.py</arg_value></tool_call>"
    message = parse_every_way(prompt, "</think>Trying." + broken + good)
    assert calls(message) == [("read", {"path": "a.py"})]
    assert len(message.errors) == 1 and "<arg_value>" in message.errors[0]
    assert message.content == "Trying." + broken  # nothing the model wrote is dropped


def test_kimi_linear_prompt_picks_kimi_k2_and_keeps_its_markers(kimi):
    prompt = ChatRenderer(kimi, "kimi_linear").render(ASK, TOOLS)
    assert prompt.tool_parser == "kimi_k2"
    assert prompt.skip_special_tokens is False
    assert "<|tool_call_begin|>" not in prompt.strip_texts


def test_kimi_linear_broken_json_arguments_are_an_error_and_kept_as_content(kimi):
    prompt = ChatRenderer(kimi, "kimi_linear").render(ASK, TOOLS)
    good = '<|tool_call_begin|>functions.read:0<|tool_call_argument_begin|>{"path": "a.py"}'
    bad = '<|tool_call_begin|>functions.Bash:1<|tool_call_argument_begin|>{"command": "ls", '
    text = (
        "Reading.<|tool_calls_section_begin|>"
        + good
        + "<|tool_call_end|>"
        + bad
        + "<|tool_call_end|><|tool_calls_section_end|>"
    )
    message = parse_every_way(prompt, text)
    assert calls(message) == [("read", {"path": "a.py"})]
    assert len(message.errors) == 1 and "invalid JSON arguments" in message.errors[0]
    # The broken call's text comes back without the special-token markers.
    assert message.content == 'Reading.functions.Bash:1{"command": "ls", '
    # A stream announced the broken call before its JSON broke: it is voided by index.
    _, _, events = _stream(prompt, [text])
    assert [e.index for e in events if isinstance(e, ToolCallError)] == [1]
    assert any(isinstance(e, ContentDelta) for e in events)


def test_templates_in_formats_no_parser_reads_get_text_tools(kimi, glm):
    k3 = ChatRenderer(kimi, "kimi_linear", XTML_TEMPLATE)
    assert k3.native_parser is None and k3.tool_parser(TOOLS) == "hermes"
    dsml = ChatRenderer(glm, "deepseek_v32", DSML_TEMPLATE)
    assert dsml.native_parser is None and dsml.tool_parser(TOOLS) == "hermes"
