"""Hook events in the TUI: a line when a hook blocks, its error with a next step when it fails."""

from __future__ import annotations

import pytest

from agent.tui.widgets.notes import ErrorNote, Note
from tests.agent.hooks.helpers import user_hooks
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tests.agent.tui.helpers import make_app, ready, send, settle, wait_until
from tools import ApprovalMode

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_blocking_hook_is_a_note_and_a_failing_one_an_error(repo, tmp_path):
    user_hooks(
        {
            "pre_tool": [
                {"command": "exit 1", "name": "flaky"},
                {
                    "matcher": "shell",
                    "command": "echo 'no shell here' >&2; exit 2",
                    "name": "guard",
                },
            ]
        }
    )
    script = [Reply("", [call("shell", command="touch ran.txt")]), Reply("Understood.")]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path, approval=ApprovalMode.FULL_AUTO)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "run it")
            await settle(pilot)
            await wait_until(pilot, lambda: any(n.text.startswith("Hook") for n in app.query(Note)))
            (note,) = [n.text for n in app.query(Note) if n.text.startswith("Hook")]
            assert note == "Hook guard (pre_tool shell) blocked: no shell here"
            (error,) = list(app.query(ErrorNote))
            assert (
                error.kind == "hook" and "'flaky' (pre_tool) exited with status 1" in error.message
            )
            assert "resident hooks list" in error.next_step
    assert not (repo / "ran.txt").exists()
