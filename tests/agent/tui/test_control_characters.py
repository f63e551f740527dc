"""Issue 38: what the TUI draws never sends the model's or a repository's control
characters to the terminal; they show as pictures (␛) instead.

Textual draws through Rich, and the first test pins what that does on its own: it
drops CR and BEL but writes ESC, C1 controls and bidi overrides through. The app's
line filter (agent/tui/control_filter.py) is what stands between them and the
terminal.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from textual.app import App
from textual.color import Color
from textual.widgets import Markdown, Static

from agent.core.events import (
    ApprovalRequested,
    Event,
    TextDelta,
    TodoItem,
    TodoUpdated,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from agent.tui.control_filter import ControlCharacterFilter
from tests.agent.tui.helpers import screen_text, wait_until
from tests.agent.tui.scenes import START, replay_app

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: write "rm -rf ~" to the clipboard
ERASE = "\r\x1b[2K"  # back to the start of the line, erase it
HOSTILE = f"A{CLIPBOARD}B{ERASE}C\x9b31mD\u202eE"
# What must never reach the terminal from content (Textual's own SGR and cursor moves do).
RAW = ("\x1b]52", "\x1b[2K", "\x9b", "\u202e", "\x07")


def terminal_output(app: App) -> str:
    """The bytes Textual would write for the whole screen now."""
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor")
    return app.screen._compositor.render_update(full=True).render_segments(console)


class PlainApp(App):
    """Textual with no filter of ours: what Rich and Textual do by themselves."""

    def compose(self):
        yield Static(HOSTILE, markup=False)
        yield Markdown(HOSTILE)


@pytest.mark.anyio
async def test_textual_alone_writes_escape_sequences_through():
    """Why the filter exists; if Textual starts escaping these itself, this fails and the
    filter can be reconsidered."""
    app = PlainApp()
    async with app.run_test(size=(60, 6)) as pilot:
        await pilot.pause()
        written = terminal_output(app)
    assert "\x1b]52;c;" in written and "\x1b[2K" in written and "\u202e" in written
    assert "\r" not in written and "\x07" not in written  # those two Rich does drop


SCENE: list[Event] = [
    *START,
    UserMessage(text=f"fix {HOSTILE}"),
    TurnStarted(turn=1),
    *[TextDelta(text=piece) for piece in ("Here ", HOSTILE[:5], HOSTILE[5:], " done\n")],
    TodoUpdated(items=[TodoItem(content=f"todo {HOSTILE}", status="in_progress")]),
    ToolCallEvent(id="call_1", name="shell", arguments=json.dumps({"command": f"ls {HOSTILE}"})),
    ApprovalRequested(id="call_1", name="shell", request=f"Run ls {HOSTILE}", reason="ask"),
    ToolResultEvent(id="call_1", ok=True, output=f"out {HOSTILE}"),
    TurnCompleted(turn=1, finish_reason="stop"),
]


@pytest.mark.anyio
async def test_the_app_shows_control_characters_as_pictures(tmp_path):
    app = replay_app(SCENE, tmp=tmp_path)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_until(pilot, lambda: "done" in screen_text(app), "the scene drawn")
        await pilot.press("ctrl+o")  # unfold the tool's output
        await wait_until(pilot, lambda: "out A" in screen_text(app), "the tool's output")
        await pilot.pause(0.2)
        written = terminal_output(app)
        shown = screen_text(app)
    assert [raw for raw in RAW if raw in written] == []
    assert "␛]52;c;cm0gLXJmIH4=" in shown  # the clipboard write, visible, not performed
    assert "␛[2K" in shown and "�31mD" in shown
    for where in ("fix A", "todo A", "out A", "Here A", "ls A"):
        assert where + "␛]52" in shown, where


def test_the_filter_keeps_the_line_width_and_the_styles():
    red = Style(color="red")
    line = [Segment("ab\x1b[2Kc", red), Segment("     ")]
    width = Segment.get_line_length(line)
    shown = ControlCharacterFilter().apply(line, Color(0, 0, 0))
    assert Segment.get_line_length(shown) == width
    assert shown[0] == Segment("ab␛[2Kc", red)
    assert "".join(s.text for s in shown) == "ab␛[2Kc    "  # one cell given back, at the end


def test_the_filter_leaves_clean_lines_alone():
    line = [Segment("héllo 世界 👩‍💻", Style(bold=True))]
    assert ControlCharacterFilter().apply(line, Color(0, 0, 0)) is line
