"""Hermes / Qwen JSON tool calls.

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

One or more such blocks, with any whitespace inside. When a body starts the
way these models write it, `{"name": "NAME", "arguments": {`, the call is
announced as soon as that much has arrived and its arguments object streams
as the model writes it, as far as it stays valid JSON (`json_prefix`). At
`</tool_call>` the whole body is parsed; if it does not say exactly what was
streamed (broken JSON, a second `arguments` key), the call is voided.

Other bodies are read whole at `</tool_call>`, because a name can only be
trusted once the JSON around it parses. Accepted there, because models
trained on this format produce them: arguments given as a JSON-encoded
string, `parameters` instead of `arguments`, missing arguments (a call
without parameters), and a JSON list of calls in one block. Their arguments
are re-serialized (`json.dumps(..., ensure_ascii=False)`); streamed ones are
the model's own text.

A body that is complete, valid JSON when the output ends is a call even
without `</tool_call>`: servers and models often stop right there.
"""

from __future__ import annotations

import json
from enum import Enum, auto
from typing import Any

from engine.chat.json_prefix import JsonObjectPrefix
from engine.chat.text_scan import (
    JsonStringTracker,
    TextAccumulator,
    split_at_marker,
    split_at_marker_outside_strings,
)
from engine.chat.tool_parsers.base import ToolParser, is_valid_tool_name, loads_strict

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

_WHITESPACE = " \t\n\r"
_NAME = object()  # stands for the tool name's string in _HEAD
_HEAD = ("{", '"name"', ":", _NAME, ",", '"arguments"', ":", "{")


class _State(Enum):
    CONTENT = auto()
    BODY = auto()  # between <tool_call> and </tool_call>


class _Mode(Enum):
    UNDECIDED = auto()  # the body so far could still start like _HEAD
    STREAMING = auto()  # it does: the call is announced, its arguments stream
    WHOLE = auto()  # it does not: the body is read at </tool_call>


class MalformedCall(ValueError):
    pass


def read_head(body: str) -> tuple[_Mode, str, int]:
    """Whether body starts with _HEAD: (mode, tool name, offset of the arguments' `{`)."""
    position = 0
    name = ""
    for token in _HEAD:
        while position < len(body) and body[position] in _WHITESPACE:
            position += 1
        if position == len(body):
            return _Mode.UNDECIDED, "", 0
        if token is _NAME:
            if body[position] != '"':
                return _Mode.WHOLE, "", 0
            end = body.find('"', position + 1)
            name = body[position + 1 : end if end >= 0 else len(body)]
            if "\\" in name:  # an escaped name is rare enough to leave to the whole parse
                return _Mode.WHOLE, "", 0
            if end < 0:
                return _Mode.UNDECIDED, "", 0
            if not is_valid_tool_name(name):
                return _Mode.WHOLE, "", 0
            position = end + 1
            continue
        piece = body[position : position + len(token)]
        if not token.startswith(piece):
            return _Mode.WHOLE, "", 0
        if len(piece) < len(token):
            return _Mode.UNDECIDED, "", 0
        position += len(token)
    return _Mode.STREAMING, name, position - 1


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


def parse_call_body(body: str) -> list[tuple[str, dict[str, Any]]]:
    """[(name, arguments)] from the text inside one <tool_call> block."""
    try:
        value = loads_strict(body)
    except ValueError as error:
        raise MalformedCall(f"tool call is not valid JSON: {error}") from error
    calls = value if isinstance(value, list) else [value]
    if not calls:
        raise MalformedCall("empty list of tool calls")
    return [_arguments_of(call) for call in calls]


class HermesToolParser(ToolParser):
    name = "hermes"
    start_markers = (CALL_OPEN,)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._state = _State.CONTENT
        self._begin_body()

    def _begin_body(self) -> None:
        # Body text moves out of the buffer as soon as no close tag can start in
        # it, so a long body arriving in small deltas is never rescanned whole.
        self._body = TextAccumulator()
        self._mode = _Mode.UNDECIDED
        self._call_name = ""
        self._validator = JsonObjectPrefix()
        self._streamed = TextAccumulator()
        self._strings = JsonStringTracker()

    def _step(self, final: bool) -> bool:
        if self._state is _State.CONTENT:
            split = split_at_marker(self._buffer, (CALL_OPEN,), final)
            self._emit_content(split.before)
            self._buffer = split.after
            if split.marker is None:
                return False
            self._enter_call_markup()
            self._state = _State.BODY
            self._begin_body()
            return True
        # Only a closing tag outside JSON strings ends the body: a string may hold
        # "<tool_call>" or "</tool_call>" (a file about tool calls).
        split = split_at_marker_outside_strings(self._buffer, CALL_CLOSE, final, self._strings)
        self._buffer = split.after
        self._strings.feed(split.before)
        self._take_body_text(split.before)
        if split.marker is not None:
            self._end_body(closed=True)
            return True
        if final:
            self._end_body(closed=False)
        return False

    def _take_body_text(self, text: str) -> None:
        if not text:
            return
        self._body += text
        if self._mode is _Mode.UNDECIDED:
            self._mode, name, start = read_head(self._body.text)
            if self._mode is _Mode.STREAMING:
                self._call_name = name
                self._open_call(name)
                self._stream_arguments(self._body.text[start:])
        elif self._mode is _Mode.STREAMING:
            self._stream_arguments(text)

    def _stream_arguments(self, text: str) -> None:
        if self._validator.complete or self._validator.failed:
            return
        piece = text[: self._validator.feed(text)]
        if self._validator.complete:
            piece = piece.rstrip()  # whitespace after the object is not the arguments'
        self._emit_arguments(piece)
        self._streamed += piece

    def _end_body(self, closed: bool) -> None:
        body = self._body.text
        raw = CALL_OPEN + body + (CALL_CLOSE if closed else "")
        self._state = _State.CONTENT
        try:
            calls = parse_call_body(body)
        except MalformedCall as error:
            message = str(error) if closed else "output ended before </tool_call>"
            self._fail_call(message, raw)
            return
        if self._mode is not _Mode.STREAMING:
            for name, arguments in calls:
                self._open_call(name)
                self._emit_arguments(json.dumps(arguments, ensure_ascii=False))
                self._close_call()
            return
        streamed = self._streamed.text
        if (
            self._validator.complete
            and len(calls) == 1
            and calls[0][0] == self._call_name
            and loads_strict(streamed) == calls[0][1]
        ):
            self._close_call()
        else:
            self._fail_call(f"call to {self._call_name!r} differs from what was streamed", raw)
