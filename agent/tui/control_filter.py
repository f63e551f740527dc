"""Every line the TUI draws shows control characters, never sends them to the terminal.

Textual draws through Rich, and both drop only BEL, backspace, VT, FF and CR
from text; ESC, the C1 controls and the bidi overrides go out to the
terminal as they are (checked against Textual 8.2: a Static, a Rich Text and
the Markdown widget all write `\\x1b]52;c;...` and `\\x1b[2K` verbatim). The
model's answer, tool output, diffs of repository files, hook and MCP names,
custom command descriptions, session titles: any of them could write the
clipboard or redraw the screen.

So the app adds one line filter (Textual's hook over every widget's rendered
lines, the same place its colour filters work): each such character becomes
its one-cell picture from agent/terminal_text.py (␛ for ESC). One filter
covers every widget, today's and later ones, with no widget having to
remember. The characters were measured as zero cells wide when the line was
laid out and are one cell now, so a line holding them gives the cells back:
from the rightmost run of blanks long enough (a widget's padding, so its
border stays), else off its right end. A hostile line may lose its last cells, never spill.
"""

from __future__ import annotations

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

from agent.terminal_text import needs_care, pictured


def _give_back(segments: list[Segment], excess: int) -> list[Segment]:
    """Take `excess` cells out of the line: from the rightmost run of that many blanks
    (a widget's padding, so its border stays), else off its right end."""
    gap = " " * excess
    for index in range(len(segments) - 1, -1, -1):
        text, style, control = segments[index]
        at = -1 if control else text.rfind(gap)
        if at >= 0:
            kept = Segment(text[:at] + text[at + excess :], style)
            return [*segments[:index], *([kept] if kept.text else []), *segments[index + 1 :]]
    width = Segment.get_line_length(segments) - excess
    return list(Segment.adjust_line_length(segments, width))


class ControlCharacterFilter(LineFilter):
    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        if not any(needs_care(segment.text) for segment in segments if not segment.control):
            return segments
        width = Segment.get_line_length(segments)
        shown = [
            segment if segment.control else Segment(pictured(segment.text), segment.style)
            for segment in segments
        ]
        return _give_back(shown, Segment.get_line_length(shown) - width)
