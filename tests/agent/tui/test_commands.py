"""Slash commands in the TUI: /context, /compact, /approval, /model, unknown ones; a bad start."""

from __future__ import annotations

import pytest

from agent.tui.screens.context import ContextScreen
from agent.tui.widgets.approval import ApprovalPrompt
from agent.tui.widgets.notes import ErrorNote, Note
from agent.tui.widgets.tool_block import ToolBlock
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tests.agent.tui.helpers import make_app, ready, send, settle, shows, wait_until

pytestmark = pytest.mark.anyio

EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")


def notes(app) -> list[str]:
    return [note.text for note in app.query(Note)]


async def test_context_compact_approval_and_model(repo, tmp_path):
    script = [
        Reply("Hi."),
        Reply("The user said hello."),
        Reply("", [EDIT]),
        Reply("Done."),
        Reply("Same session, other model."),
    ]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "/context")
            await wait_until(pilot, lambda: isinstance(app.screen, ContextScreen), "/context")
            report = app.screen.report
            assert {f.path for f in report.files} == {"calc.py", "test_calc.py", "README.md"}
            assert all(f.tokens > 0 for f in report.files)
            assert sum(f.tokens for f in report.files) <= report.snapshot_tokens
            await shows(pilot, "calc.py")
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ContextScreen), "back")

            await send(pilot, "hello")
            await settle(pilot)
            await send(pilot, "/compact")
            await wait_until(pilot, lambda: len(server.requests) == 2, "the summary request")
            await shows(pilot, "Compacted 2 messages")

            await send(pilot, "/approval sometimes")
            await wait_until(pilot, lambda: any("unknown approval mode" in n for n in notes(app)))
            await send(pilot, "/approval auto-edit")
            await wait_until(pilot, lambda: app.status.approval == "auto-edit", "the new mode")
            await send(pilot, "fix add")
            await settle(pilot)
            assert "return a + b" in (repo / "calc.py").read_text()  # not asked
            assert not app.query(ApprovalPrompt)
            assert [b.status for b in app.query(ToolBlock)] == ["done"]

            await send(pilot, "/model")
            await wait_until(pilot, lambda: any("Model: scripted-model" in n for n in notes(app)))
            session = app.bridge.session_id()
            await send(pilot, "/model other-model")
            await wait_until(pilot, lambda: app.status.model == "other-model", "the switch")
            await send(pilot, "still fixed?")
            await settle(pilot)
            assert server.requests[-1]["model"] == "other-model"
            assert app.bridge.session_id() == session  # the conversation went on
            assert any(m.get("content") == "fix add" for m in server.requests[-1]["messages"])
            await send(pilot, "/frobnicate")
            await wait_until(
                pilot, lambda: any("Unknown command /frobnicate" in n for n in notes(app))
            )
    after_compaction = server.requests[2]["messages"]
    assert "The user said hello." in after_compaction[1]["content"]  # the summary replaced it
    assert all(m.get("content") != "hello" for m in after_compaction)


async def test_a_failed_start_says_what_to_do_and_quits_with_its_code(repo, tmp_path):
    with ScriptedServer([], api_key="right") as server:
        app = make_app(server.url, repo, tmp_path, api_key="wrong")
        async with app.run_test(size=(110, 40)) as pilot:
            await wait_until(pilot, lambda: app.query(ErrorNote), "the error")
            [error] = app.query(ErrorNote)
            assert error.kind == "authentication" and "--api-key" in error.message
            assert not app.ready
            await pilot.press("ctrl+q")
            await wait_until(pilot, lambda: not app.is_running, "the app to quit")
    assert app.return_value == 1
