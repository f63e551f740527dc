"""Finding tag markers in text that arrives in arbitrary pieces.

A streaming parser may only emit text once it knows the text is not the start
of a marker: `<tool` could become `<tool_call>`. These helpers find the first
complete marker and measure how much of a buffer's tail must be held back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# What can change whether JSON text is inside a string literal.
_STRING_SPECIAL = re.compile(r'["\\\x00-\x1f]')


def find_first_marker(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """Position and marker of the earliest complete marker in text (longest on a tie)."""
    best: tuple[int, str] | None = None
    for marker in markers:
        position = text.find(marker)
        if position < 0:
            continue
        if (
            best is None
            or position < best[0]
            or (position == best[0] and len(marker) > len(best[1]))
        ):
            best = (position, marker)
    return best


def held_back_length(text: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of text that is a proper prefix of some marker.

    That tail may still grow into a marker, so it cannot be emitted yet.
    """
    # Called on every delta: most tails hold no marker's first character at all.
    window = text[-max((len(m) for m in markers), default=0) :]
    if not any(marker[:1] in window for marker in markers if marker):
        return 0
    longest = 0
    for marker in markers:
        for length in range(min(len(text), len(marker) - 1), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest


def is_marker_prefix(text: str, markers: Sequence[str]) -> bool:
    """True when text could still grow into one of the markers."""
    return any(marker.startswith(text) for marker in markers)


@dataclass(frozen=True)
class MarkerSplit:
    before: str  # safe to hand on: no marker in it, and no marker can start in it
    marker: str | None  # the first complete marker, if there is one
    after: str  # text after the marker; without a marker, the held-back tail


def split_at_marker(text: str, markers: Sequence[str], final: bool) -> MarkerSplit:
    """Split text at its first complete marker, or hold back a possible marker start.

    With `final` (the stream has ended) nothing can grow any more, so nothing
    is held back.
    """
    found = find_first_marker(text, markers)
    if found is not None:
        position, marker = found
        return MarkerSplit(text[:position], marker, text[position + len(marker) :])
    hold = 0 if final else held_back_length(text, markers)
    return MarkerSplit(text[: len(text) - hold], None, text[len(text) - hold :])


class WhitespaceTrimmer:
    """Streams text with leading and trailing whitespace removed.

    Leading whitespace is dropped until the first other character; trailing
    whitespace is held until more text follows it, and dropped if none does.
    The pushed pieces therefore concatenate to `whole.strip()` however the
    text was split.
    """

    def __init__(self, strip_leading: bool = True) -> None:
        self._started = not strip_leading
        self._held = ""

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept) :]
        return kept


class JsonStringTracker:
    """Whether JSON text read so far stops inside a string literal.

    A closing tag inside a string (a tool writing a file about tool calls) is
    argument text, not the end of the call. A raw control character cannot be
    inside a valid JSON string, so one ends the string here: a malformed body
    whose quote was never closed still ends at a closing tag on its own line.
    """

    def __init__(self) -> None:
        self.inside = False
        self._escaped = False

    def copy(self) -> JsonStringTracker:
        twin = JsonStringTracker()
        twin.inside, twin._escaped = self.inside, self._escaped
        return twin

    def feed(self, text: str) -> None:
        position = 0
        while position < len(text):
            if self._escaped:
                self._escaped = False
                position += 1
            elif not self.inside:
                quote = text.find('"', position)
                if quote < 0:
                    return
                self.inside = True
                position = quote + 1
            else:
                found = _STRING_SPECIAL.search(text, position)
                if found is None:
                    return
                if found.group() == "\\":
                    self._escaped = True
                else:  # the closing quote, or a control character no string may hold
                    self.inside = False
                position = found.end()


def split_at_marker_outside_strings(
    text: str, marker: str, final: bool, strings: JsonStringTracker
) -> MarkerSplit:
    """`split_at_marker` for one marker, skipping occurrences inside JSON strings.

    `strings` is the state at the start of `text`; it is not advanced (the
    caller feeds it the text it consumes).
    """
    probe = strings.copy()
    scanned = 0
    position = text.find(marker)
    while position >= 0:
        probe.feed(text[scanned:position])
        scanned = position
        if not probe.inside:
            return MarkerSplit(text[:position], marker, text[position + len(marker) :])
        position = text.find(marker, position + 1)
    hold = 0 if final else held_back_length(text, (marker,))
    return MarkerSplit(text[: len(text) - hold], None, text[len(text) - hold :])


class TextAccumulator:
    """A growing string with O(1) appends (`acc += piece`), joined only when read.

    A long tool call arrives in thousands of small deltas; `str +=` would copy
    the whole call on each one.
    """

    def __init__(self, text: str = "") -> None:
        self._parts = [text]

    def __iadd__(self, piece: str) -> TextAccumulator:
        self._parts.append(piece)
        return self

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0]
