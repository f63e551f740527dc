"""Chat messages and tool definitions in the one shape every chat template is given.

Callers hand over what their API carries (OpenAI-style dicts from the server,
the agent's history, a user's `LLM.chat` list). Normalizing here, once, is
what makes the same conversation render to the same bytes whichever caller
sent it: a key one caller leaves out and another sets to None, or tool
arguments as a JSON string in one and an object in another, would otherwise
render differently under templates that test for a key or `tojson` a value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.chat.json_limits import loads_bounded


class ChatRenderError(ValueError):
    """The conversation cannot be rendered; `param` names the offending field when known."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _flatten_content(content: Any, index: int) -> str:
    if content is None:
        # String-concatenating templates (ChatML) fail on None; "" reads the same to the rest.
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ChatRenderError(
                f"content part of type {kind!r} is not supported (text only)",
                param=f"messages.{index}.content",
            )
        if not isinstance(part.get("text"), str):
            raise ChatRenderError("a text part needs a string `text`", f"messages.{index}.content")
        parts.append(part["text"])
    return "".join(parts)


def _template_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Native templates (Qwen, GLM, Kimi) iterate or `tojson` the arguments: give
        # them the object. Anything that is not a JSON object stays as written.
        try:
            parsed = loads_bounded(arguments) if arguments.strip() else {}
        except ValueError:  # not JSON, or too deep to hand a template
            parsed = None
        if isinstance(parsed, dict):
            function["arguments"] = parsed
    return {**call, "function": function}


def template_message(message: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One message as templates read it: no None values, text content, object arguments."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ChatRenderError("each message needs a string `role`", param=f"messages.{index}")
    data = {key: value for key, value in message.items() if value is not None}
    if data["role"] == "developer":  # OpenAI's newer name for the system role
        data["role"] = "system"
    data["content"] = _flatten_content(message.get("content"), index)
    calls = [_template_call(call) for call in data.pop("tool_calls", None) or []]
    if calls:
        data["tool_calls"] = calls
    return data


def template_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [template_message(message, index) for index, message in enumerate(messages)]


def template_tools(tools: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI `tools` entries reduced to what a template renders (name, description,
    parameters), in that order, so extra keys one client sends never reach the prompt."""
    out = []
    for index, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ChatRenderError("each tool needs a function with a name", f"tools.{index}")
        kept = {
            key: function[key]
            for key in ("name", "description", "parameters")
            if function.get(key) is not None
        }
        out.append({"type": "function", "function": kept})
    return out
