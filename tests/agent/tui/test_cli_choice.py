"""`resident` opens the TUI on a terminal, the line REPL with --plain or when piped."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import agent.cli
import agent.repl
import agent.tui
from agent.cli import app


@pytest.fixture
def front_ends(monkeypatch):
    chosen = []
    monkeypatch.setattr(agent.tui, "run_tui", lambda options: chosen.append(("tui", options)) or 0)
    monkeypatch.setattr(
        agent.repl, "run_repl", lambda options: chosen.append(("repl", options)) or 0
    )
    return chosen


def invoke(*args: str):
    return CliRunner().invoke(app, ["--attach", "http://127.0.0.1:9", *args])


def test_a_terminal_gets_the_tui(front_ends, monkeypatch):
    monkeypatch.setattr(agent.cli, "_on_terminal", lambda: True)
    result = invoke("--continue")
    assert result.exit_code == 0, result.output
    [(kind, options)] = front_ends
    assert kind == "tui" and options.continue_last and options.attach == "http://127.0.0.1:9"


def test_plain_or_a_pipe_gets_the_line_repl(front_ends, monkeypatch):
    result = invoke()  # CliRunner's stdin is not a terminal
    assert result.exit_code == 0, result.output
    monkeypatch.setattr(agent.cli, "_on_terminal", lambda: True)
    result = invoke("--plain", "--resume", "abc")
    assert result.exit_code == 0, result.output
    assert [kind for kind, _ in front_ends] == ["repl", "repl"]
    assert front_ends[1][1].resume == "abc"


def test_resume_and_continue_together_is_a_usage_error(front_ends):
    result = invoke("--resume", "abc", "--continue")
    assert result.exit_code == 2
    assert front_ends == []
