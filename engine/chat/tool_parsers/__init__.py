"""Tool-call parsers for the models the engine serves, and how to pick one.

Use:

    parser_class = get_tool_parser(detect_tool_parser(model_type, chat_template))
    parser = parser_class(tools=request_tools)  # one per response
    events = parser.feed(delta) ... + parser.finish()  # streaming
    message = parser.parse_complete(text)  # non-streaming
"""

from __future__ import annotations

from engine.chat.tool_parsers.base import ToolParser, new_call_id
from engine.chat.tool_parsers.glm import Glm45ToolParser, Glm47ToolParser
from engine.chat.tool_parsers.hermes import HermesToolParser
from engine.chat.tool_parsers.kimi_k2 import KimiK2ToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (KimiK2ToolParser, Glm45ToolParser, Glm47ToolParser, HermesToolParser)
}

# model_type values (config.json) whose native format each parser reads. Kimi
# Linear's released template writes K2's format (its `<|tool_calls_section_begin|>`
# markers), so it reads as K2; Kimi K3's `text_config` is a kimi_linear one too,
# but its template speaks XTML (below), which no parser here reads.
_KIMI_MODEL_TYPES = frozenset({"kimi_k2", "kimi_k25", "kimi_linear", "deepseek_v3"})
# GLM families, each with the variant its template writes when the template does not
# tell (none given). GLM-5.x (glm_moe_dsa) writes GLM-4.7's format: vLLM's GLM-5.1
# recipe serves it with `--tool-call-parser glm47`, SGLang registers `glm5` as its
# GLM-4.7 detector (sgl-project/sglang#19925).
_GLM_MODEL_TYPES = {"glm4_moe": "glm45", "glm4_moe_lite": "glm45", "glm_moe_dsa": "glm47"}
_HERMES_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama"})

_KIMI_TEMPLATE_MARKER = "<|tool_call_begin|>"
# DeepSeek-V3's own template uses these; such a checkpoint does not speak Kimi's format.
_DEEPSEEK_TEMPLATE_MARKER = "<｜tool▁calls▁begin｜>"
# DeepSeek V3.2 writes calls in DSML (`<｜DSML｜function_calls>`), which no parser here
# reads: its requests with tools get text tools instead.
_DSML_TEMPLATE_MARKER = "｜DSML｜"
# Kimi K3's template writes every turn, its thinking and its calls as XTML tags
# (`<|open|>call tool="..."<|sep|>` ... `<|close|>call<|sep|>`): not K2's format.
_XTML_TEMPLATE_MARKERS = ("<|open|>", "<|close|>")


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered under `name` (kimi_k2, glm45, glm47, hermes)."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"unknown tool parser {name!r} (known: {known})") from None


def _glm_variant(chat_template: str, default: str = "glm45") -> str:
    # GLM-4.5/4.6 templates put a newline before each <arg_key> (as a real
    # newline, or as `\n` inside a Jinja string); GLM-4.7's and GLM-5's do not.
    if "\n<arg_key>" in chat_template or "\\n<arg_key>" in chat_template:
        return "glm45"
    if "<arg_key>" in chat_template:
        return "glm47"
    return default


def _speaks_other_format(template: str) -> bool:
    """Whether a Kimi-family template writes a format other than K2's (DeepSeek-V3's
    own markers, or Kimi K3's XTML), so the K2 parser would find no calls in it."""
    if _KIMI_TEMPLATE_MARKER in template:
        return False
    return _DEEPSEEK_TEMPLATE_MARKER in template or all(
        marker in template for marker in _XTML_TEMPLATE_MARKERS
    )


def detect_tool_parser(model_type: str | None, chat_template: str | None) -> str | None:
    """The parser name for a checkpoint, or None when its format is not supported.

    Chosen by `model_type`; the chat template settles GLM-4.5 against 4.7 and
    rules out DeepSeek-V3 proper (same model_type as some Kimi conversions,
    different markers) and Kimi K3's XTML. Any other model_type (DeepSeek V3.2's
    `deepseek_v32` among them, which GLM-5 conversions also carry) goes by the
    markers its template writes; DeepSeek V3.2's own DSML reads as no format.
    """
    model_type = (model_type or "").lower()
    template = chat_template or ""
    if model_type in _KIMI_MODEL_TYPES or model_type.startswith("kimi"):
        return None if _speaks_other_format(template) else "kimi_k2"
    if model_type in _GLM_MODEL_TYPES:
        return _glm_variant(template, _GLM_MODEL_TYPES[model_type])
    if model_type in _HERMES_MODEL_TYPES:
        return "hermes"
    if _DSML_TEMPLATE_MARKER in template:
        return None
    if _KIMI_TEMPLATE_MARKER in template:
        return "kimi_k2"
    if "<arg_key>" in template:
        return _glm_variant(template)
    if "<tool_call>" in template:
        return "hermes"
    return None


__all__ = [
    "TOOL_PARSERS",
    "Glm45ToolParser",
    "Glm47ToolParser",
    "HermesToolParser",
    "KimiK2ToolParser",
    "ToolParser",
    "detect_tool_parser",
    "get_tool_parser",
    "new_call_id",
]
