"""MCP servers in the TUI: one line when a server fails, and /mcp listing servers and tools."""

from __future__ import annotations

import pytest

from agent.tui.widgets.notes import Note
from tests.agent.mcp.helpers import demo_entry, write_user_config
from tests.agent.scripted_server import ScriptedServer
from tests.agent.tui.helpers import make_app, ready, send, wait_until

pytestmark = pytest.mark.anyio


def notes(app) -> list[str]:
    return [note.text for note in app.query(Note)]


async def test_a_failed_server_is_one_line_and_slash_mcp_lists_the_rest(repo, tmp_path):
    write_user_config({"demo": demo_entry(), "gone": {"command": str(tmp_path / "gone")}})
    with ScriptedServer([]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await wait_until(
                pilot, lambda: any(n.startswith("MCP server gone failed") for n in notes(app))
            )
            failed = [n for n in notes(app) if n.startswith("MCP server")]
            assert len(failed) == 1 and "its tools are unavailable" in failed[0]
            await wait_until(pilot, lambda: app.bridge.runtime.mcp.manager.version == 1, "ready")
            await send(pilot, "/mcp")
            await wait_until(pilot, lambda: any("mcp__demo__echo" in n for n in notes(app)))
            (listing,) = [n for n in notes(app) if "mcp__demo__echo" in n]
            assert "demo  stdio  ready  9 tools" in listing
            assert "gone  stdio  failed" in listing
            assert "MCP tools are offered to the model now" in listing
