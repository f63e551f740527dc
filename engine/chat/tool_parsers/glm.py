"""GLM-4.5 / 4.6 / 4.7 native tool calls.

    GLM-4.5/4.6: <tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>
    GLM-4.7:     <tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>

The two differ only in the newlines between tags, and models drift between
the two (spaces appear too), so one parser reads both, ignoring whitespace
between tags. Values are typed as `argument_types` explains.

Arguments arrive as key/value pairs, not JSON, so the parser writes the JSON
itself as pairs complete: `{"k": ` when a key closes, the value, `, "k2": `
for the next key, `}` at `</tool_call>`. Those pieces concatenate to exactly
`json.dumps(arguments, ensure_ascii=False)`. A value known to be a string (by
schema, or because it cannot be JSON) is streamed character by character as a
JSON string while it is written, so a long file body does not arrive in one
piece at the end; other values are sent when their closing tag arrives.

Inside a value only `</arg_value>` ends it: code the model writes may well
contain `<tool_call>`.
"""

from __future__ import annotations

import json
from enum import Enum, auto

from engine.chat.text_scan import (
    TextAccumulator,
    find_first_marker,
    is_marker_prefix,
    split_at_marker,
)
from engine.chat.tool_parsers.argument_types import (
    ArgumentTypes,
    convert_value,
    is_string_only,
    may_be_untyped_json,
)
from engine.chat.tool_parsers.base import ToolParser, is_valid_tool_name

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
KEY_OPEN = "<arg_key>"
KEY_CLOSE = "</arg_key>"
VALUE_OPEN = "<arg_value>"
VALUE_CLOSE = "</arg_value>"
ALL_TAGS = (CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)


class _State(Enum):
    CONTENT = auto()
    NAME = auto()  # after <tool_call>, up to the first <arg_key> or </tool_call>
    BETWEEN_ARGUMENTS = auto()  # expecting <arg_key> or </tool_call>
    KEY = auto()
    BEFORE_VALUE = auto()  # expecting <arg_value>
    VALUE = auto()
    SKIP = auto()  # the rest of a malformed call, passed through as content


class _ValueMode(Enum):
    UNDECIDED = auto()  # only whitespace seen, no schema: could still be JSON or text
    STREAMED_STRING = auto()  # opening quote sent; escaped text follows as it arrives
    BUFFERED = auto()  # typed at the closing tag


def _json_string_body(text: str) -> str:
    # JSON escapes character by character, so escaped pieces concatenate to the
    # escaped whole; the quotes are sent separately.
    return json.dumps(text, ensure_ascii=False)[1:-1]


class Glm45ToolParser(ToolParser):
    name = "glm45"
    start_markers = (CALL_OPEN,)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._types = ArgumentTypes(self.tools)
        self._state = _State.CONTENT
        self._raw = TextAccumulator()
        self._call_name = ""
        self._keys: set[str] = set()
        self._key = ""
        self._value_types: frozenset[str] = frozenset()
        self._value_mode = _ValueMode.UNDECIDED
        self._value_text = TextAccumulator()
        self._handlers = {
            _State.CONTENT: self._scan_content,
            _State.NAME: self._scan_name,
            _State.BETWEEN_ARGUMENTS: self._scan_between_arguments,
            _State.KEY: self._scan_key,
            _State.BEFORE_VALUE: self._scan_before_value,
            _State.VALUE: self._scan_value,
            _State.SKIP: self._skip_malformed,
        }

    def _step(self, final: bool) -> bool:
        return self._handlers[self._state](final)

    def _fail_and_skip(self, message: str) -> None:
        """Void the call; its text so far, and the rest up to its end, become content."""
        self._fail_call(message, self._raw.text)
        self._state = _State.SKIP

    def _fail_at_end(self, final: bool) -> bool:
        """No closing tag yet: wait, or at the end of output void the call."""
        if final:
            self._fail_call("output ended inside a tool call", self._raw.text + self._buffer)
            self._buffer = ""
            self._state = _State.CONTENT
        return False

    def _expect_tag(self, expected: tuple[str, ...], final: bool) -> str | None:
        """Skip layout whitespace; consume and return one of `expected`, or None to wait.

        Anything else fails the call (the state becomes SKIP).
        """
        text = self._buffer.lstrip()
        self._raw += self._buffer[: len(self._buffer) - len(text)]
        self._buffer = text
        for tag in expected:
            if text.startswith(tag):
                self._raw += tag
                self._buffer = text[len(tag) :]
                return tag
        if not text or (not final and is_marker_prefix(text, expected)):
            self._fail_at_end(final)
            return None
        self._fail_and_skip(f"expected {' or '.join(expected)} in call {self._call_name!r}")
        return None

    def _scan_content(self, final: bool) -> bool:
        split = split_at_marker(self._buffer, (CALL_OPEN,), final)
        self._emit_content(split.before)
        self._buffer = split.after
        if split.marker is None:
            return False
        self._enter_call_markup()
        self._raw = TextAccumulator(CALL_OPEN)
        self._keys = set()
        self._state = _State.NAME
        return True

    def _scan_name(self, final: bool) -> bool:
        found = find_first_marker(self._buffer, ALL_TAGS)
        if found is None:
            return self._fail_at_end(final)
        position, tag = found
        name = self._buffer[:position].strip()
        self._raw += self._buffer[:position]
        self._buffer = self._buffer[position:]
        if tag not in (KEY_OPEN, CALL_CLOSE):
            self._fail_and_skip(f"expected arguments after tool name {name!r}, found {tag}")
        elif not is_valid_tool_name(name):
            self._fail_and_skip(f"{name!r} is not a tool name")
        else:
            self._call_name = name
            self._open_call(name)
            self._state = _State.BETWEEN_ARGUMENTS
        return True

    def _scan_between_arguments(self, final: bool) -> bool:
        tag = self._expect_tag((KEY_OPEN, CALL_CLOSE), final)
        if tag == KEY_OPEN:
            self._state = _State.KEY
        elif tag == CALL_CLOSE:
            self._emit_arguments("}" if self._keys else "{}")
            self._close_call()
            self._state = _State.CONTENT
        return tag is not None or self._state is _State.SKIP

    def _scan_key(self, final: bool) -> bool:
        found = find_first_marker(self._buffer, ALL_TAGS)
        if found is None:
            return self._fail_at_end(final)
        position, tag = found
        key = self._buffer[:position].strip()
        self._raw += self._buffer[:position]
        self._buffer = self._buffer[position:]
        if tag != KEY_CLOSE:
            self._fail_and_skip(f"argument name not closed by {KEY_CLOSE}, found {tag}")
        elif not key:
            self._fail_and_skip("empty argument name")
        elif key in self._keys:
            # JSON with a repeated key means different things to different readers.
            self._fail_and_skip(f"argument {key!r} given twice")
        else:
            self._raw += KEY_CLOSE
            self._buffer = self._buffer[len(KEY_CLOSE) :]
            separator = ", " if self._keys else "{"
            self._keys.add(key)
            self._key = key
            self._emit_arguments(f"{separator}{json.dumps(key, ensure_ascii=False)}: ")
            self._state = _State.BEFORE_VALUE
        return True

    def _scan_before_value(self, final: bool) -> bool:
        tag = self._expect_tag((VALUE_OPEN,), final)
        if tag is None:
            return self._state is _State.SKIP
        self._value_types = self._types.types_of(self._call_name, self._key)
        self._value_mode = _ValueMode.UNDECIDED
        self._value_text = TextAccumulator()
        self._state = _State.VALUE
        self._absorb_value("")
        return True

    def _scan_value(self, final: bool) -> bool:
        split = split_at_marker(self._buffer, (VALUE_CLOSE,), final)
        self._buffer = split.after
        self._raw += split.before
        self._absorb_value(split.before)
        if split.marker is None:
            return self._fail_at_end(final)
        self._raw += VALUE_CLOSE
        self._complete_value()
        self._state = _State.BETWEEN_ARGUMENTS
        return True

    def _absorb_value(self, text: str) -> None:
        if self._value_mode is _ValueMode.STREAMED_STRING:
            self._emit_arguments(_json_string_body(text))
            return
        self._value_text += text
        if self._value_mode is _ValueMode.BUFFERED:
            return
        # Decide once, from the text alone, so any split of it decides the same way.
        if is_string_only(self._value_types) or (
            not self._value_types and not may_be_untyped_json(self._value_text.text)
        ):
            self._value_mode = _ValueMode.STREAMED_STRING
            self._emit_arguments('"' + _json_string_body(self._value_text.text))
        elif self._value_types:
            self._value_mode = _ValueMode.BUFFERED
        elif self._value_text.text.strip():
            self._value_mode = _ValueMode.BUFFERED

    def _complete_value(self) -> None:
        if self._value_mode is _ValueMode.STREAMED_STRING:
            self._emit_arguments('"')
        else:
            value = convert_value(self._value_text.text, self._value_types)
            self._emit_arguments(json.dumps(value, ensure_ascii=False))

    def _skip_malformed(self, final: bool) -> bool:
        """Pass a malformed call's remaining text through as content, up to its end."""
        split = split_at_marker(self._buffer, (CALL_CLOSE, CALL_OPEN), final)
        self._emit_content(split.before)
        if split.marker is None:
            self._buffer = split.after
            return False
        if split.marker == CALL_CLOSE:
            self._emit_content(CALL_CLOSE)
            self._buffer = split.after
        else:
            self._buffer = split.marker + split.after
        self._state = _State.CONTENT
        return True


class Glm47ToolParser(Glm45ToolParser):
    """GLM-4.7 writes no newlines between tags; the shared parser ignores them anyway."""

    name = "glm47"
