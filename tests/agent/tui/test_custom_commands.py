"""Custom commands in the TUI: completion, /help, running one, the problems note, the menu's look."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from textual.pilot import Pilot

from agent.tui.widgets.notes import Note
from agent.tui.widgets.user_block import UserBlock
from tests.agent.scripted_server import Reply, ScriptedServer
from tests.agent.tui.helpers import make_app, ready, send, settle, wait_until
from tests.agent.tui.scenes import MAIN, replay_app
from tests.agent.tui.test_snapshots import SIZE, drawn

pytestmark = pytest.mark.anyio

REVIEW = """---
description: Review a file for bugs
argument-hint: FILE
---
Review $1 for bugs; say which line is wrong.
"""
EXPANDED = "Review calc.py for bugs; say which line is wrong."


def labels(app) -> list[str]:
    completions = app.prompt.menu.completions
    return [item.label for item in completions.items] if completions else []


def notes_with(app, text: str) -> list[Note]:
    return [note for note in app.query(Note) if text in str(note.render())]


async def test_completion_help_and_running_a_custom_command(repo, tmp_path):
    folder = repo / ".resident" / "commands"
    folder.mkdir(parents=True)
    (folder / "review.md").write_text(REVIEW)
    (folder / "diff.md").write_text("Shadows the built-in /diff.\n")
    with ScriptedServer([Reply("Line 5 subtracts.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            # The file that shadows a built-in is named in a note, once.
            await wait_until(pilot, lambda: notes_with(app, "diff.md is not used"), "the note")
            # Completion offers the custom commands after the built-ins, with descriptions.
            await pilot.press("/")
            assert labels(app)[-1] == "/review" and "/diff" in labels(app)
            await pilot.press("r", "e")
            (item,) = app.prompt.menu.completions.items
            assert (item.label, item.insert, item.help) == (
                "/review",
                "/review ",
                "FILE Review a file for bugs",
            )
            # A file added during the session is offered at the next completion.
            (folder / "refactor.md").write_text("# Refactor the module\n\nMake it simpler.\n")
            await pilot.press("f")
            assert labels(app) == ["/refactor"]
            app.prompt.clear()
            await pilot.pause()
            # Running it: the user block shows what was typed, the model gets the expansion.
            await send(pilot, "/review calc.py")
            await settle(pilot)
            assert [u.text for u in app.query(UserBlock)] == ["/review calc.py"]
            assert server.requests[0]["messages"][-1] == {"role": "user", "content": EXPANDED}
            # /help lists them; /diff is still the built-in.
            await send(pilot, "/help")
            await wait_until(pilot, lambda: app.query("Markdown.help"), "the help")
            source = app.query_one("Markdown.help").source
            assert "**Custom commands**" in source
            assert "| `/review FILE` | Review a file for bugs | repository: review.md |" in source
            assert "| `/refactor` | Refactor the module | repository: refactor.md |" in source
            assert "/diff`" not in source.split("**Custom commands**")[1]
            assert len(notes_with(app, "diff.md is not used")) == 1
            # An unknown name is still an unknown command, not a message to the model.
            await send(pilot, "/nosuch thing")
            await wait_until(pilot, lambda: notes_with(app, "Unknown command /nosuch"))
    assert len(server.requests) == 1


def test_the_completion_menu_with_a_custom_command(snap_compare, tmp_path):
    commands = Path(os.environ["RESIDENT_CONFIG_DIR"]) / "commands"
    commands.mkdir(parents=True)
    (commands / "commit.md").write_text(
        "---\ndescription: Commit the staged changes with a message that says why\n"
        "argument-hint: [SCOPE]\n---\nCommit the staged changes. $ARGUMENTS\n"
    )

    async def open_menu(pilot: Pilot) -> None:
        await drawn(pilot)
        await pilot.press("/", "c")
        await wait_until(pilot, lambda: pilot.app.prompt.menu.is_open, "the menu")
        await pilot.pause(0.2)

    app = replay_app(MAIN, tmp=tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=open_menu)
