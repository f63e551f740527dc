"""The `resident` command: errors are messages with exit codes, never tracebacks."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.cli import app
from tests.engine.checkpoints import tiny_llama

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


def test_chat_streams_a_reply_and_quits(tmp_path):
    model_dir = tiny_llama(tmp_path / "m")
    result = runner.invoke(app, ["--model", str(model_dir)], input="hello there\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "Resident chat" in result.output
    # The tiny random model says something; the prompt comes back for the next line.
    assert result.output.count("> ") >= 2
