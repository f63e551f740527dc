"""Kimi K2 (K2, K2.5, K2.6) native tool calls.

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>
    ...
    <|tool_calls_section_end|>

The header `functions.NAME:IDX` is the call's id, exactly as Kimi's chat
template writes it back into the history; NAME may contain dots, dashes,
underscores and colons (the trailing `:IDX` is split off). The arguments are
already JSON, so they are streamed as the model writes them (trimmed of
surrounding whitespace) and checked when the call ends.

The markers are special tokens, so the engine must detokenize with special
tokens kept for this parser to see them.
"""

from __future__ import annotations

import re
from enum import Enum, auto

from engine.chat.text_scan import (
    TextAccumulator,
    WhitespaceTrimmer,
    find_first_marker,
    is_marker_prefix,
    split_at_marker,
)
from engine.chat.tool_parsers.base import ToolParser, is_valid_tool_name, json_object_error

# Kimi's tokenizer also has the singular spelling; accept both.
SECTION_BEGINS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_ENDS = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

# Markers after which a malformed call's remaining text stops being its raw text.
_NEXT_STRUCTURE = (CALL_BEGIN, *SECTION_ENDS)
_HEADER = re.compile(r"(?P<qualified>.+?)(?::(?P<index>\d+))?")


class _State(Enum):
    CONTENT = auto()  # plain text, watching for a section (or a bare call)
    SECTION = auto()  # between calls inside a section
    HEADER = auto()  # reading `functions.NAME:IDX`
    ARGUMENTS = auto()  # streaming the JSON arguments
    SKIP = auto()  # the rest of a malformed call, passed through as content


def parse_header(header: str, calls_so_far: int) -> tuple[str, str] | None:
    """(id, name) from a call header, or None when it names no tool."""
    match = _HEADER.fullmatch(header)
    if match is None:
        return None
    qualified = match["qualified"]
    name = qualified.removeprefix("functions.")
    if not is_valid_tool_name(name):
        return None
    if match["index"] is not None:
        return header, name
    # Kimi always numbers its calls; give an unnumbered one the id it would have had.
    return f"{qualified}:{calls_so_far}", name


class KimiK2ToolParser(ToolParser):
    name = "kimi_k2"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._state = _State.CONTENT
        # The current call's text so far, to give back if it is malformed.
        self._raw = TextAccumulator()
        self._arguments = TextAccumulator()
        self._trimmer = WhitespaceTrimmer()
        self._call_name = ""
        self._calls_seen = 0
        self._in_stray_text = False
        self._state_after_call = _State.SECTION

    def _step(self, final: bool) -> bool:
        if self._state is _State.CONTENT:
            return self._scan_content(final)
        if self._state is _State.SECTION:
            return self._scan_section(final)
        if self._state is _State.HEADER:
            return self._scan_header(final)
        if self._state is _State.ARGUMENTS:
            return self._scan_arguments(final)
        return self._skip_malformed(final)

    def _begin_call(self, in_section: bool) -> None:
        # A call written without its section returns to plain text, not to a section.
        self._state_after_call = _State.SECTION if in_section else _State.CONTENT
        self._state = _State.HEADER
        self._raw = TextAccumulator(CALL_BEGIN)
        self._arguments = TextAccumulator()
        self._trimmer = WhitespaceTrimmer()

    def _fail(self, message: str, raw_text: str, then: _State) -> None:
        self._fail_call(message, raw_text)
        self._state = then

    def _scan_content(self, final: bool) -> bool:
        split = split_at_marker(self._buffer, (*SECTION_BEGINS, CALL_BEGIN), final)
        self._emit_content(split.before)
        self._buffer = split.after
        if split.marker is None:
            return False
        self._enter_call_markup()
        if split.marker == CALL_BEGIN:  # a call without its section: tolerated
            self._begin_call(in_section=False)
        else:
            self._state = _State.SECTION
        return True

    def _scan_section(self, final: bool) -> bool:
        if not self._in_stray_text:
            self._buffer = self._buffer.lstrip()  # layout between calls
        text = self._buffer
        if not text:
            return False
        if text.startswith(CALL_BEGIN):
            self._buffer = text[len(CALL_BEGIN) :]
            self._in_stray_text = False
            self._begin_call(in_section=True)
            return True
        for section_end in SECTION_ENDS:
            if text.startswith(section_end):
                self._buffer = text[len(section_end) :]
                self._in_stray_text = False
                self._state = _State.CONTENT
                return True
        if not final and is_marker_prefix(text, _NEXT_STRUCTURE):
            return False
        # Text where only calls belong: keep it as content, report it once per run.
        if not self._in_stray_text:
            self._report("unexpected text inside the tool-call section")
            self._in_stray_text = True
        split = split_at_marker(text, _NEXT_STRUCTURE, final)
        self._emit_content(split.before)
        self._buffer = text[len(split.before) :]
        return bool(split.before)

    def _scan_header(self, final: bool) -> bool:
        found = find_first_marker(self._buffer, (ARGUMENT_BEGIN, CALL_END, *_NEXT_STRUCTURE))
        if found is None:
            if final:
                self._fail(
                    "output ended inside a tool call",
                    self._raw.text + self._buffer,
                    self._state_after_call,
                )
                self._buffer = ""
            return False
        position, marker = found
        header = self._buffer[:position]
        if marker != ARGUMENT_BEGIN:
            self._buffer = self._buffer[position:]
            self._fail(
                f"tool call {header.strip()!r} has no arguments",
                self._raw.text + header,
                _State.SKIP,
            )
            return True
        self._raw += header + marker
        self._buffer = self._buffer[position + len(marker) :]
        parsed = parse_header(header.strip(), self._calls_seen)
        if parsed is None:
            self._fail(
                f"tool call header {header.strip()!r} names no tool", self._raw.text, _State.SKIP
            )
            return True
        call_id, self._call_name = parsed
        self._calls_seen += 1
        self._open_call(self._call_name, call_id)
        self._state = _State.ARGUMENTS
        return True

    def _scan_arguments(self, final: bool) -> bool:
        # Only the end marker ends the arguments: a JSON string may quote the others.
        split = split_at_marker(self._buffer, (CALL_END,), final)
        self._buffer = split.after
        self._raw += split.before
        self._arguments += split.before
        self._emit_arguments(self._trimmer.push(split.before))
        if split.marker is None:
            if final:
                self._fail(
                    f"output ended inside the arguments of {self._call_name!r}",
                    self._raw.text,
                    self._state_after_call,
                )
            return False
        self._raw += CALL_END
        self._end_arguments()
        return True

    def _end_arguments(self) -> None:
        text = self._arguments.text.strip()
        if not text:  # a call to a tool without parameters
            self._emit_arguments("{}")
            text = "{}"
        error = json_object_error(text)
        if error is None:
            self._close_call()
            self._state = self._state_after_call
        else:
            message = f"tool call {self._call_name!r} has invalid JSON arguments: {error}"
            self._fail(message, self._raw.text, self._state_after_call)

    def _skip_malformed(self, final: bool) -> bool:
        """Pass a malformed call's remaining text through as content, up to its end."""
        split = split_at_marker(self._buffer, (CALL_END, *_NEXT_STRUCTURE), final)
        self._emit_content(split.before)
        if split.marker is None:
            self._buffer = split.after
            return False
        if split.marker == CALL_END:
            self._emit_content(CALL_END)
            self._buffer = split.after
        else:
            self._buffer = split.marker + split.after
        self._state = self._state_after_call
        return True
