"""Hermes / Qwen JSON tool calls.

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

One or more such blocks, with any whitespace inside. The body is read whole
when `</tool_call>` arrives, then the call is announced and its arguments sent
in one delta: a name can only be trusted once the JSON around it parses, and
the models that use this format are small, so their calls are short.

Also accepted, because models trained on this format produce them: arguments
given as a JSON-encoded string, `parameters` instead of `arguments`, missing
arguments (a call without parameters), and a JSON list of calls in one block.
The arguments are re-serialized (`json.dumps(..., ensure_ascii=False)`).
"""

from __future__ import annotations

import json
from enum import Enum, auto
from typing import Any

from engine.chat.text_scan import split_at_marker
from engine.chat.tool_parsers.base import ToolParser, is_valid_tool_name, loads_strict

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


class _State(Enum):
    CONTENT = auto()
    BODY = auto()  # between <tool_call> and </tool_call>


class MalformedCall(ValueError):
    pass


def _arguments_of(call: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(call, dict):
        raise MalformedCall(f"a call must be a JSON object, not {type(call).__name__}")
    name = call.get("name")
    if not isinstance(name, str) or not is_valid_tool_name(name):
        raise MalformedCall(f"{name!r} is not a tool name")
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = loads_strict(arguments) if arguments.strip() else {}
        except ValueError as error:
            raise MalformedCall(f"arguments of {name!r} are not JSON: {error}") from error
    if not isinstance(arguments, dict):
        raise MalformedCall(f"arguments of {name!r} must be a JSON object")
    return name, arguments


def parse_call_body(body: str) -> list[tuple[str, str]]:
    """[(name, arguments_json)] from the text inside one <tool_call> block."""
    try:
        value = loads_strict(body)
    except ValueError as error:
        raise MalformedCall(f"tool call is not valid JSON: {error}") from error
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise MalformedCall("empty list of tool calls")
    parsed = [_arguments_of(call) for call in calls]
    return [(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in parsed]


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._state = _State.CONTENT
        # How far the body has been searched for the closing tag: a long body
        # arriving in small deltas must not be rescanned from its start each time.
        self._searched = 0

    def _step(self, final: bool) -> bool:
        if self._state is _State.CONTENT:
            split = split_at_marker(self._buffer, (CALL_OPEN,), final)
            self._emit_content(split.before)
            self._buffer = split.after
            if split.marker is None:
                return False
            self._enter_call_markup()
            self._state = _State.BODY
            self._searched = 0
            return True
        # Only the closing tag ends the body: a JSON string may contain "<tool_call>".
        position = self._buffer.find(CALL_CLOSE, self._searched)
        if position < 0:
            self._searched = max(0, len(self._buffer) - len(CALL_CLOSE) + 1)
            if final:
                self._fail_call("output ended before </tool_call>", CALL_OPEN + self._buffer)
                self._buffer = ""
                self._state = _State.CONTENT
            return False
        body = self._buffer[:position]
        self._buffer = self._buffer[position + len(CALL_CLOSE) :]
        self._state = _State.CONTENT
        try:
            calls = parse_call_body(body)
        except MalformedCall as error:
            self._fail_call(str(error), CALL_OPEN + body + CALL_CLOSE)
            return True
        for name, arguments_json in calls:
            self._open_call(name)
            self._emit_arguments(arguments_json)
            self._close_call()
        return True
