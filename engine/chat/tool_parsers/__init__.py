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

# model_type values (config.json) whose native format each parser reads.
_KIMI_MODEL_TYPES = frozenset({"kimi_k2", "kimi_k25", "deepseek_v3"})
_GLM_MODEL_TYPES = frozenset({"glm4_moe", "glm4_moe_lite"})
_HERMES_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "llama"})

_KIMI_TEMPLATE_MARKER = "<|tool_call_begin|>"
# DeepSeek-V3's own template uses these; such a checkpoint does not speak Kimi's format.
_DEEPSEEK_TEMPLATE_MARKER = "<｜tool▁calls▁begin｜>"


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered under `name` (kimi_k2, glm45, glm47, hermes)."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"unknown tool parser {name!r} (known: {known})") from None


def _glm_variant(chat_template: str) -> str:
    # GLM-4.5/4.6 templates put a newline before each <arg_key> (as a real
    # newline, or as `\n` inside a Jinja string); GLM-4.7's does not.
    if "\n<arg_key>" in chat_template or "\\n<arg_key>" in chat_template:
        return "glm45"
    if "<arg_key>" in chat_template:
        return "glm47"
    return "glm45"


def detect_tool_parser(model_type: str | None, chat_template: str | None) -> str | None:
    """The parser name for a checkpoint, or None when its format is not supported.

    Chosen by `model_type`; the chat template settles GLM-4.5 against 4.7 and
    rules out DeepSeek-V3 proper (same model_type as some Kimi conversions,
    different markers). An unknown model_type falls back to the markers its
    template writes.
    """
    model_type = (model_type or "").lower()
    template = chat_template or ""
    if model_type in _KIMI_MODEL_TYPES or model_type.startswith("kimi"):
        if _DEEPSEEK_TEMPLATE_MARKER in template and _KIMI_TEMPLATE_MARKER not in template:
            return None
        return "kimi_k2"
    if model_type in _GLM_MODEL_TYPES:
        return _glm_variant(template)
    if model_type in _HERMES_MODEL_TYPES:
        return "hermes"
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
