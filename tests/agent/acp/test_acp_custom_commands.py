"""Slash commands over ACP: the list sent after session/new and session/load, a custom
command run from a prompt, a built-in (/compact) run from one, and a file that shadows a
built-in logged and left out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from acp import text_block
from acp.schema import AvailableCommandsUpdate

from agent.core.commands import find_command
from tests.agent.acp.acp_client import EditorClient, resident_acp, stderr_of
from tests.agent.scripted_server import Reply, ScriptedServer

pytestmark = pytest.mark.anyio

TIMEOUT = 60
REVIEW = """---
description: Review a file for bugs
argument-hint: FILE
---
Review $1 for bugs; say which line is wrong.
"""
EXPANDED = "Review calc.py for bugs; say which line is wrong."


class CommandsClient(EditorClient):
    """Records which session each update was for, too."""

    def __init__(self) -> None:
        super().__init__()
        self.sessions: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.sessions.append(session_id)
        await super().session_update(session_id, update, **kwargs)

    def command_lists(self, session_id: str) -> list[list[tuple[str, str, str | None]]]:
        """Each commands update for the session: (name, description, input hint)."""
        return [
            [
                (c.name, c.description, c.input.root.hint if c.input else None)
                for c in u.available_commands
            ]
            for sid, u in zip(self.sessions, self.updates, strict=True)
            if sid == session_id and isinstance(u, AvailableCommandsUpdate)
        ]


async def until(condition, what: str) -> None:
    for _ in range(int(TIMEOUT / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def builtin(name: str) -> tuple[str, str, None]:
    command = find_command("/" + name)
    assert command is not None
    return (name, command.help, None)


async def test_commands_are_offered_and_run_and_come_back_on_load(repo):
    folder = repo / ".resident" / "commands"
    folder.mkdir(parents=True)
    (folder / "review.md").write_text(REVIEW)
    (folder / "undo.md").write_text("Shadows the built-in /undo.\n")
    first = CommandsClient()
    script = [Reply("Line 5 subtracts."), Reply("The user asked for a review of calc.py.")]
    with ScriptedServer(script) as server:
        async with resident_acp(first, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            sid = session.session_id
            await until(lambda: first.command_lists(sid), "the commands update")
            assert first.command_lists(sid) == [
                [builtin("compact"), builtin("mcp"), ("review", "Review a file for bugs", "FILE")]
            ]
            # A custom command as the prompt: the model gets the expansion.
            reviewed = await asyncio.wait_for(
                agent.conn.prompt(session_id=sid, prompt=[text_block("/review calc.py")]), TIMEOUT
            )
            # A file added during the session: the list is sent again after the next prompt.
            (folder / "standup.md").write_text("List what changed since yesterday.\n")
            compacted = await asyncio.wait_for(
                agent.conn.prompt(session_id=sid, prompt=[text_block("/compact")]), TIMEOUT
            )
            offered = first.command_lists(sid)
        second = CommandsClient()
        async with resident_acp(second, server.url, repo) as agent:
            await asyncio.wait_for(
                agent.conn.load_session(cwd=str(repo), session_id=sid, mcp_servers=[]), TIMEOUT
            )
            await until(lambda: second.command_lists(sid), "the commands update after load")
    log = stderr_of(repo)
    assert reviewed.stop_reason == "end_turn", log
    assert [m["content"] for m in server.requests[0]["messages"] if m["role"] == "user"] == [
        EXPANDED
    ]
    # /compact ran the compaction (the second request) and said so; it is no task.
    assert compacted.stop_reason == "end_turn"
    assert len(server.requests) == 2
    assert first.text().endswith("Compacted the conversation.")
    assert [names for names in ([n for n, *_ in lst] for lst in offered)] == [
        ["compact", "mcp", "review"],
        ["compact", "mcp", "review", "standup"],
    ]
    # The shadowing file is logged once a session (two sessions here, one a process), and
    # /undo is no custom command.
    assert log.count(".resident/commands/undo.md is not used: /undo is a built-in") == 2
    # Reloaded: the user's message is what they typed, and the list comes again.
    assert second.user_text() == "/review calc.py"
    assert [n for n, *_ in second.command_lists(sid)[0]] == ["compact", "mcp", "review", "standup"]
