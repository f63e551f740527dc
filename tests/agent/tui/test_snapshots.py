"""Snapshots of the TUI's main screens (pytest-textual-snapshot).

Regenerate after a deliberate change of the look with
`pytest tests/agent/tui/test_snapshots.py --snapshot-update` and review the SVGs.
"""

from __future__ import annotations

from textual.pilot import Pilot

from agent.tui.screens.context import ContextScreen
from agent.tui.widgets.approval import ApprovalPrompt
from tests.agent.tui.helpers import wait_until
from tests.agent.tui.scenes import EDIT, EDITED, MAIN, replay_app

SIZE = (100, 34)


async def drawn(pilot: Pilot) -> None:
    app = pilot.app
    app.prompt.cursor_blink = False
    await wait_until(
        pilot, lambda: app.ready and app.status.rate is not None or app.query(ApprovalPrompt)
    )
    await pilot.pause(0.2)


def test_main_screen(snap_compare, tmp_path):
    assert snap_compare(replay_app(MAIN, tmp=tmp_path), terminal_size=SIZE, run_before=drawn)


def test_approval(snap_compare, tmp_path):
    app = replay_app(EDIT, approval=True, tmp=tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=drawn)


def test_diff(snap_compare, tmp_path):
    assert snap_compare(replay_app(EDITED, tmp=tmp_path), terminal_size=SIZE, run_before=drawn)


def test_context(snap_compare, tmp_path):
    async def open_context(pilot: Pilot) -> None:
        await drawn(pilot)
        pilot.app.prompt.load_text("/context")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, ContextScreen))
        await pilot.pause(0.2)

    assert snap_compare(replay_app(MAIN, tmp=tmp_path), terminal_size=SIZE, run_before=open_context)
