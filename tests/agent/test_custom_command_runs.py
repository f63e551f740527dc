"""Custom commands run from `resident run` and the line REPL, against the scripted server."""

from __future__ import annotations

import io
from pathlib import Path

from agent.core.runtime import RuntimeOptions
from agent.repl import Repl
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer

REVIEW = """---
description: Review a file for bugs
argument-hint: FILE
---
Review $1 for bugs; say which line is wrong.
"""
EXPANDED = "Review calc.py for bugs; say which line is wrong."


def add_commands(repo: Path) -> Path:
    folder = repo / ".resident" / "commands"
    folder.mkdir(parents=True)
    (folder / "review.md").write_text(REVIEW)
    (folder / "help.md").write_text("Shadows the built-in /help.\n")
    return folder


def user_contents(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def test_run_expands_the_command_and_a_resumed_session_keeps_the_expansion(repo):
    add_commands(repo)
    with ScriptedServer([Reply("Line 5 subtracts."), Reply("Yes, only that one.")]) as server:
        first = run_cli("/review calc.py", *attached(server.url))
        session = first.of_type("session_started")[0]["session_id"]
        again = run_cli("Only that line?", *attached(server.url, "--resume", session))
    assert first.exit_code == 0, first.stderr
    assert again.exit_code == 0, again.stderr
    # The user's message is what was typed; the model got the expansion ...
    assert [e["text"] for e in first.of_type("user_message")] == ["/review calc.py"]
    assert user_contents(server.requests[0]) == [EXPANDED]
    # ... and so does the resumed session, whose history is the conversation kept.
    assert user_contents(server.requests[1]) == [EXPANDED, "Only that line?"]
    assert first.final["final_message"] == "Line 5 subtracts."
    # A file that shadows a built-in is named on stderr, and the run goes on.
    assert "warning: .resident/commands/help.md is not used: /help is a built-in" in first.stderr


def test_a_task_that_names_no_custom_command_goes_as_typed(repo):
    add_commands(repo)
    with ScriptedServer([Reply("It is a path.")]) as server:
        result = run_cli("/tmp/out.log has an error", *attached(server.url))
    assert result.exit_code == 0, result.stderr
    assert user_contents(server.requests[0]) == ["/tmp/out.log has an error"]


def test_repl_lists_runs_and_refuses_commands(repo):
    folder = add_commands(repo)
    out = io.StringIO()
    lines = iter(["/help", "/review calc.py", "/nosuch", "/standup", "/quit"])

    def read_line(prompt: str) -> str:
        line = next(lines)
        if line == "/standup":  # a command file added during the session is there at once
            (folder / "standup.md").write_text("List what changed since yesterday.\n")
        return line

    with ScriptedServer([Reply("Reviewed."), Reply("Listed.")]) as server:
        options = RuntimeOptions(workspace=repo, attach=server.url, context_window=32768)
        code = Repl(options, out=out, read_line=read_line).run()
    assert code == 0
    text = out.getvalue()
    assert "/review FILE  Review a file for bugs" in text  # /help lists them
    assert text.count("help.md is not used") == 1  # told once, at the start
    assert "unknown command /nosuch" in text
    assert user_contents(server.requests[0]) == [EXPANDED]
    assert user_contents(server.requests[1])[-1] == "List what changed since yesterday."
    assert "Reviewed." in text and "Listed." in text
