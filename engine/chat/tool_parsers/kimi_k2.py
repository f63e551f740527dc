"""Kimi K2 (K2, K2.5, K2.6) native tool calls.

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>
    ...
    <|tool_calls_section_end|>

The header names the tool (`kimi_header` reads it, including the shapes a
client's rewritten ids teach the model). The arguments are already JSON, so
they are streamed as the model writes them, trimmed of surrounding whitespace
and only as far as they stay a valid JSON-object prefix (`json_prefix`); they
are checked when the call ends. A call whose header names no tool is held
until its arguments are complete, then named by the one tool schema they fit,
or dropped as ambiguous.

Tolerated, because Kimi models write them: a call without its section, a call
without argument marker (a tool without parameters), a missing
`<|tool_call_end|>` when the JSON object is complete and the next call, the
section end or the end of output follows, repeated or stray markers. The
markers are special tokens, so none of them ever appears in content: stray
ones are dropped, and a malformed call's text is given back without them.

The engine must detokenize with special tokens kept for this parser to see
the markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

from engine.chat.json_prefix import JsonObjectPrefix
from engine.chat.text_scan import (
    TextAccumulator,
    WhitespaceTrimmer,
    find_first_marker,
    held_back_length,
    is_marker_prefix,
    split_at_marker,
)
from engine.chat.tool_parsers.base import ToolParser, json_object_error, loads_strict
from engine.chat.tool_parsers.kimi_header import call_id, read_header
from engine.chat.tool_parsers.schema_match import matching_tools, tool_functions

# Kimi's tokenizer also has the singular spelling; accept both.
SECTION_BEGINS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_ENDS = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
ALL_MARKERS = (*SECTION_BEGINS, *SECTION_ENDS, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)

# Markers that start the next piece of structure: they end a call left open.
_NEXT_STRUCTURE = frozenset({CALL_BEGIN, *SECTION_BEGINS, *SECTION_ENDS})


def strip_markers(text: str) -> str:
    for marker in ALL_MARKERS:
        text = text.replace(marker, "")
    return text


class _State(Enum):
    CONTENT = auto()  # plain text, watching for a section (or a bare call)
    SECTION = auto()  # between calls inside a section
    HEADER = auto()  # reading `functions.NAME:IDX`
    ARGUMENTS = auto()  # the JSON arguments


@dataclass
class _Call:
    header: str
    name: str | None  # None: held until the arguments tell which tool it is
    index: int
    arguments: TextAccumulator = field(default_factory=TextAccumulator)
    trimmer: WhitespaceTrimmer = field(default_factory=WhitespaceTrimmer)
    validator: JsonObjectPrefix = field(default_factory=JsonObjectPrefix)
    sent: int = 0  # characters of the trimmed arguments already streamed

    def raw_text(self) -> str:
        """What the model wrote for this call, markers left out."""
        return strip_markers(self.header + self.arguments.text)


class KimiK2ToolParser(ToolParser):
    name = "kimi_k2"
    start_markers = (*SECTION_BEGINS, CALL_BEGIN)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._tool_names = frozenset(f["name"] for f in tool_functions(self.tools))
        self._state = _State.CONTENT
        self._call: _Call | None = None
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
        return self._scan_arguments(final)

    # -- outside calls ---------------------------------------------------------

    def _begin_call(self, in_section: bool) -> None:
        # A call written without its section returns to plain text, not to a section.
        self._state_after_call = _State.SECTION if in_section else _State.CONTENT
        self._state = _State.HEADER

    def _scan_content(self, final: bool) -> bool:
        split = split_at_marker(self._buffer, ALL_MARKERS, final)
        self._emit_content(split.before)
        self._buffer = split.after
        if split.marker is None:
            return False
        self._enter_call_markup()
        if split.marker == CALL_BEGIN:  # a call without its section: tolerated
            self._begin_call(in_section=False)
        elif split.marker in SECTION_BEGINS:
            self._state = _State.SECTION
        # Any other marker here closes nothing that is open: it is dropped.
        return True

    def _scan_section(self, final: bool) -> bool:
        if not self._in_stray_text:
            self._buffer = self._buffer.lstrip()  # layout between calls
        text = self._buffer
        if not text:
            return False
        for marker in ALL_MARKERS:
            if text.startswith(marker):
                self._buffer = text[len(marker) :]
                self._in_stray_text = False
                if marker == CALL_BEGIN:
                    self._begin_call(in_section=True)
                elif marker in SECTION_ENDS:
                    self._state = _State.CONTENT
                return True  # a repeated section begin, or a stray end: dropped
        if not final and is_marker_prefix(text, ALL_MARKERS):
            return False
        # Text where only calls belong: keep it as content, report it once per run.
        if not self._in_stray_text:
            self._report("unexpected text inside the tool-call section")
            self._in_stray_text = True
        split = split_at_marker(text, ALL_MARKERS, final)
        self._emit_content(split.before)
        self._buffer = text[len(split.before) :]
        return bool(split.before)

    # -- one call -------------------------------------------------------------

    def _scan_header(self, final: bool) -> bool:
        found = find_first_marker(self._buffer, ALL_MARKERS)
        if found is None:
            if final:
                self._fail_call("output ended inside a tool call header", self._buffer)
                self._buffer = ""
                self._state = self._state_after_call
            return False
        position, marker = found
        header = self._buffer[:position]
        if marker in _NEXT_STRUCTURE:
            self._buffer = self._buffer[position:]
            self._fail_call(f"tool call {header.strip()!r} has no arguments", header)
            self._state = self._state_after_call
            return True
        self._buffer = self._buffer[position + len(marker) :]
        self._start_call(header)
        if marker == CALL_END:  # no argument marker at all: a tool without parameters
            self._end_call()
        return True

    def _start_call(self, header: str) -> None:
        parsed = read_header(header.strip(), self._tool_names)
        index = parsed.index if parsed.index is not None else self._calls_seen
        self._calls_seen += 1
        name = parsed.name
        if name is None and len(self._tool_names) == 1:
            (name,) = self._tool_names  # the only tool there is
        self._call = _Call(header=header, name=name, index=index)
        if name is not None:
            self._open_call(name, call_id(name, index))
        self._state = _State.ARGUMENTS

    def _scan_arguments(self, final: bool) -> bool:
        call = self._call
        assert call is not None
        found = find_first_marker(self._buffer, ALL_MARKERS)
        if found is None:
            hold = 0 if final else held_back_length(self._buffer, ALL_MARKERS)
            self._absorb(self._buffer[: len(self._buffer) - hold])
            self._buffer = self._buffer[len(self._buffer) - hold :]
            if final:
                if call.validator.complete:  # only <|tool_call_end|> is missing
                    self._end_call()
                else:
                    self._fail_open_call(
                        f"output ended inside the arguments of {call.header.strip()!r}"
                    )
            return False
        position, marker = found
        self._absorb(self._buffer[:position])
        inside_string = call.validator.in_string and not call.validator.failed
        if inside_string:
            # Only a JSON string can hold marker text (a file about tool calls):
            # it is argument text, even the call's own end marker.
            self._buffer = self._buffer[position + len(marker) :]
            self._absorb(marker)
        elif marker == CALL_END:
            self._buffer = self._buffer[position + len(marker) :]
            self._end_call()
        elif marker in _NEXT_STRUCTURE:
            # The call's end marker is missing; the next structure ends the call.
            self._buffer = self._buffer[position:]
            self._end_call()
        else:  # a repeated <|tool_call_argument_begin|>: dropped
            self._buffer = self._buffer[position + len(marker) :]
        return True

    def _absorb(self, text: str) -> None:
        """Argument text in; as much of it streamed as is known to be valid."""
        call = self._call
        if not text or call is None:
            return
        call.arguments += text
        trimmed = call.trimmer.push(text)
        accepted = call.validator.feed(trimmed)
        if call.name is not None and accepted:
            self._emit_arguments(trimmed[:accepted])
            call.sent += accepted

    def _end_call(self) -> None:
        call = self._call
        assert call is not None
        text = call.arguments.text.strip() or "{}"  # no arguments: a tool without parameters
        error = json_object_error(text)
        if error is not None:
            self._fail_open_call(
                f"tool call {call.header.strip()!r} has invalid JSON arguments: {error}"
            )
            return
        if call.name is None:
            name = self._name_from_arguments(text)
            if name is None:
                return  # reported and given back as text
            self._open_call(name, call_id(name, call.index))
            call.name = name
        # Streaming stops at the first character the validator refuses; a complete,
        # valid text means it refused none, but send whatever is left regardless.
        self._emit_arguments(text[call.sent :])
        self._close_call()
        self._call = None
        self._state = self._state_after_call

    def _name_from_arguments(self, text: str) -> str | None:
        call = self._call
        assert call is not None
        header = call.header.strip()
        names = matching_tools(loads_strict(text), self.tools)
        if len(names) == 1:
            return names[0]
        if not self._tool_names:
            reason = "the request has no tools to match its arguments against"
        elif not names:
            reason = "its arguments fit none of the request's tools"
        else:
            reason = f"its arguments fit several tools ({', '.join(names)})"
        self._fail_open_call(f"tool call header {header!r} names no tool, and {reason}")
        return None

    def _fail_open_call(self, message: str) -> None:
        call = self._call
        assert call is not None
        self._fail_call(message, call.raw_text())
        self._call = None
        self._state = self._state_after_call
