"""The streaming machinery every tool-call format shares.

Each format is a state machine over a text buffer (`_step`); this base class
owns the buffer, the call numbering, the events and the rules that are the
same everywhere:

- Text is emitted only when no marker can start in it (see `text_scan`).
- A call is announced (`ToolCallDelta` with id and name) once its name is
  known, its argument text follows in deltas, and `ToolCallEnd` closes it.
- A malformed call gives `ToolCallError` and its raw text as content (Kimi's
  special-token markers left out, since they never belong in text). In the
  default (incremental) mode an announced call cannot be taken back, so the
  error names its index and the consumer must drop it. With
  `hold_until_complete=True` a call's deltas are held until it ends, so a
  malformed call is never announced at all and indices have no gaps.
- Whitespace between and after calls is layout, not content, so it is dropped.

`parse_complete` is defined as streaming the whole text and folding the events
(`collect_events`), so the complete and streaming results agree by
construction; tests check that they agree however the text is split.
"""

from __future__ import annotations

import re
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from engine.chat.events import (
    ContentDelta,
    ParsedMessage,
    StreamEvent,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    collect_events,
    merge_adjacent_deltas,
)
from engine.chat.json_limits import loads_bounded

_ID_ALPHABET = string.ascii_letters + string.digits
# Tool names are identifiers, possibly namespaced (MCP-style `server.tool`,
# `a-b`, `ns:tool`, `ns/tool`); whitespace or JSON/tag punctuation means the
# model wrote something that is not a name.
_TOOL_NAME = re.compile(r"[\w.\-:/]+")


def new_call_id() -> str:
    """An OpenAI-style call id for formats whose calls carry none."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def is_valid_tool_name(name: str) -> bool:
    return _TOOL_NAME.fullmatch(name) is not None


def json_object_error(text: str) -> str | None:
    """Why text is not a JSON object, or None when it is one."""
    try:
        value = loads_strict(text)
    except ValueError as error:
        return str(error)
    if not isinstance(value, dict):
        return f"arguments must be a JSON object, not {type(value).__name__}"
    return None


def loads_strict(text: str) -> Any:
    """json.loads without NaN/Infinity, non-finite numbers or nesting deeper than
    MAX_JSON_DEPTH (a model can write any of them); raises ValueError."""
    return loads_bounded(text, strict=True)


class ToolParser(ABC):
    """Parses one model output: `feed` deltas, then `finish`; or `parse_complete`.

    One instance per response. `tools` are the request's OpenAI tool schemas;
    formats whose arguments are untyped text (GLM) use them to type values,
    and Kimi uses them to name calls whose header names no tool.
    """

    name: ClassVar[str]
    # Markers that open a tool call. A model may open one while still inside
    # `<think>`; the reasoning parser ends the reasoning there (see output.py).
    start_markers: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        hold_until_complete: bool = False,
        make_call_id: Callable[[], str] = new_call_id,
    ) -> None:
        self.tools: list[dict[str, Any]] = list(tools or [])
        self.hold_until_complete = hold_until_complete
        self.make_call_id = make_call_id
        self._buffer = ""
        self._finished = False
        self._events: list[StreamEvent] = []
        self._open_index: int | None = None
        self._next_index = 0
        self._next_public_index = 0  # call numbering seen by the consumer when holding
        self._held_call_events: list[ToolCallDelta] = []
        # Whitespace after a finished call, held until we know whether real
        # content follows (then it is emitted) or another call / the end (dropped).
        self._whitespace_after_call: str | None = None

    # -- public interface ------------------------------------------------

    def feed(self, delta_text: str) -> list[StreamEvent]:
        """Consume the next piece of model output; return the events it completes."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buffer += delta_text
        self._run(final=False)
        return self._take_events()

    def finish(self) -> list[StreamEvent]:
        """The output has ended: flush held text and report unfinished calls."""
        if self._finished:
            return []
        self._finished = True
        self._run(final=True)
        self._whitespace_after_call = None
        return self._take_events()

    def parse_complete(self, text: str) -> ParsedMessage:
        """Parse a whole model output. Does not touch this instance's stream state."""
        fresh = type(self)(self.tools, make_call_id=self.make_call_id)
        return collect_events(fresh.feed(text) + fresh.finish())

    # -- what each format implements -------------------------------------

    @abstractmethod
    def _step(self, final: bool) -> bool:
        """Advance the state machine over `self._buffer`; False when it must wait."""

    # -- helpers for the formats -----------------------------------------

    def _run(self, final: bool) -> None:
        while self._step(final):
            pass

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        if self._whitespace_after_call is not None:
            text = self._whitespace_after_call + text
            if not text.strip():
                self._whitespace_after_call = text
                return
            self._whitespace_after_call = None
        self._push(ContentDelta(text))

    def _enter_call_markup(self) -> None:
        """A call marker was seen: whitespace before it was only layout."""
        self._whitespace_after_call = None

    def _open_call(self, name: str, call_id: str | None = None) -> None:
        self._open_index = self._next_index
        self._next_index += 1
        identifier = call_id if call_id is not None else self.make_call_id()
        self._push(ToolCallDelta(self._open_index, "", id=identifier, name=name))

    def _emit_arguments(self, text: str) -> None:
        if text and self._open_index is not None:
            self._push(ToolCallDelta(self._open_index, text))

    def _close_call(self) -> None:
        if self._open_index is not None:
            self._push(ToolCallEnd(self._open_index))
            self._open_index = None
        self._whitespace_after_call = ""

    def _fail_call(self, message: str, raw_text: str) -> None:
        """Void the current call (announced or not) and keep its text as content."""
        self._push(ToolCallError(f"{self.name}: {message}", self._open_index))
        self._open_index = None
        self._whitespace_after_call = None
        self._emit_content(raw_text)

    def _report(self, message: str) -> None:
        """An error that voids no call (e.g. stray text where only calls belong)."""
        self._push(ToolCallError(f"{self.name}: {message}"))

    def _push(self, event: StreamEvent) -> None:
        if not self.hold_until_complete:
            self._events.append(event)
        elif isinstance(event, ToolCallDelta):
            self._held_call_events.append(event)
        elif isinstance(event, ToolCallEnd):
            index = self._next_public_index
            self._next_public_index += 1
            self._events.extend(replace(held, index=index) for held in self._held_call_events)
            self._events.append(ToolCallEnd(index))
            self._held_call_events = []
        elif isinstance(event, ToolCallError) and event.index is not None:
            # The consumer never saw this call, so there is nothing to void.
            self._held_call_events = []
            self._events.append(ToolCallError(event.message))
        else:
            self._events.append(event)

    def _take_events(self) -> list[StreamEvent]:
        events, self._events = self._events, []
        return merge_adjacent_deltas(events)
