"""The `resident` command: errors are messages with exit codes, never tracebacks."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.cli import app
from tests.agent.scripted_server import Reply, ScriptedServer

runner = CliRunner()


def test_models_list_reports_default_not_pulled(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = runner.invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)
    default = next(e for e in entries if e["name"] == "smollm2-135m-instruct")
    assert default["present"] is False


def test_missing_model_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = runner.invoke(app, ["--model", "smollm2-135m-instruct"])
    assert result.exit_code == 1
    assert "resident models pull" in result.output
    assert "Traceback" not in result.output


def test_resident_opens_the_agent_and_quits(tmp_path, monkeypatch):
    """`resident` with no subcommand is the agent, line by line (agent/repl.py)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello\n")
    with ScriptedServer([Reply("Hello back.")]) as server:
        args = ["--attach", server.url, "--context-window", "8192"]
        result = runner.invoke(app, args, input="hello there\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "Hello back." in result.output
    assert "approval ask" in result.output  # the default mode
    # The prompt comes back after the answer.
    assert result.output.count("> ") >= 2


def test_resume_and_continue_together_are_a_usage_error():
    for command in ([], ["run", "a task"]):
        args = [*command, "--resume", "20261203-000000-abcdef", "--continue"]
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (command, result.output)
        assert "not both" in result.output and "Traceback" not in result.output
