"""Prompt-side pieces of tool calling shared by every front end that renders chats.

The server and the agent's local client must build identical prompts for the
same conversation, so both take these from here: which text markers each
tool-call format is read by, whether a template can render `tools` at all,
and, for templates that cannot (the default SmolLM2's plain ChatML), how tool
traffic is rewritten as Hermes text (`<tool_call>{json}</tool_call>`) with the
caller's instructions in the system message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.chat.json_limits import loads_bounded
from engine.chat.tool_parsers import glm, hermes, kimi_k2

# The text markers each tool-call format is read by.
PARSER_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": (hermes.CALL_OPEN, hermes.CALL_CLOSE),
    "glm45": glm.ALL_TAGS,
    "glm47": glm.ALL_TAGS,
    "kimi_k2": (
        *kimi_k2.SECTION_BEGINS,
        *kimi_k2.SECTION_ENDS,
        kimi_k2.CALL_BEGIN,
        kimi_k2.ARGUMENT_BEGIN,
        kimi_k2.CALL_END,
    ),
}


def template_renders_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in (chat_template or "")


def read_model_type(model_dir: Path) -> str | None:
    """config.json's model_type; nested text configs (Kimi K2.5/K2.6) name the text model."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text_config = config.get("text_config")
    if isinstance(text_config, dict) and text_config.get("model_type"):
        return text_config["model_type"]
    return config.get("model_type")


def call_as_text(call: dict[str, Any]) -> str:
    """One OpenAI-shaped tool call as Hermes text."""
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads_bounded(arguments)
        except ValueError:
            pass  # keep what the caller sent; the model sees it as written
    body = {"name": function.get("name", ""), "arguments": arguments}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def inline_tools(messages: list[dict[str, Any]], instructions: str | None) -> list[dict]:
    """Messages with tool calls and results written as Hermes text, and `instructions`
    (which describe the tools) appended to the system message or given as one."""
    out: list[dict[str, Any]] = []
    for message in messages:
        message = dict(message)
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = "\n".join(call_as_text(call) for call in message.pop("tool_calls"))
            content = message.get("content") or ""
            message["content"] = f"{content}\n{calls}" if content else calls
        elif message["role"] == "tool":
            result = message.get("content") or ""
            message = {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"}
        out.append(message)
    if instructions:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out
