"""`resident hooks list|trust|untrust`, and hook events in `resident run` and its printers."""

from __future__ import annotations

import io
import json

from typer.testing import CliRunner

from agent.cli import app
from agent.core.events import HookRun
from agent.event_printers import ProgressPrinter
from tests.agent.helpers import attached, run_cli
from tests.agent.hooks.helpers import repository_hooks, user_hooks
from tests.agent.scripted_server import Reply, ScriptedServer


def hooks_cli(*args: str):
    return CliRunner().invoke(app, ["hooks", *args], catch_exceptions=False)


def listed(repo) -> dict:
    result = hooks_cli("list", "--json", "-w", str(repo))
    return json.loads(result.stdout)


def test_trust_list_and_untrust_a_repository(repo):
    user_hooks({"stop": [{"command": "echo mine"}]})
    repository_hooks(repo, {"pre_tool": [{"matcher": "shell", "command": "./check.sh"}]})
    files = listed(repo)["files"]
    assert [(f["source"], f["trust"]) for f in files] == [
        ("user", "own"),
        ("repository", "untrusted"),
    ]
    text = hooks_cli("list").stdout  # the current directory is the repository
    assert "NOT trusted: run `resident hooks trust`" in text
    assert "pre_tool [shell]: ./check.sh  (timeout 60 s)" in text

    trusted = hooks_cli("trust")
    assert trusted.exit_code == 0
    assert "these hooks will run" in trusted.stdout and "./check.sh" in trusted.stdout
    assert listed(repo)["files"][1]["trust"] == "trusted"

    repository_hooks(repo, {"pre_tool": [{"command": "./check.sh --all"}]})
    assert listed(repo)["files"][1]["trust"] == "changed"
    assert "CHANGED since you trusted it" in hooks_cli("list").stdout

    hooks_cli("trust")
    untrusted = hooks_cli("untrust")
    assert untrusted.exit_code == 0 and "no longer trusted" in untrusted.stdout
    assert listed(repo)["files"][1]["trust"] == "untrusted"
    assert "nothing changed" in hooks_cli("untrust").stdout


def test_trust_refuses_a_missing_or_broken_file_and_list_reports_problems(repo):
    missing = hooks_cli("trust")
    assert missing.exit_code == 1 and "does not exist" in missing.stderr
    (repo / ".resident").mkdir()
    (repo / ".resident" / "hooks.json").write_text('{"hooks": {"stop": [{"comand": "x"}]}}')
    broken = hooks_cli("trust")
    assert broken.exit_code == 1 and "hooks.stop.0.comand: unknown field" in broken.stderr
    assert "fix it before trusting it" in broken.stderr
    listing = hooks_cli("list", "--json")
    assert listing.exit_code == 1
    (problem,) = json.loads(listing.stdout)["problems"]
    assert "unknown field" in problem


def test_headless_json_carries_hook_events_and_a_refused_prompt_exits_1(repo):
    user_hooks({"user_prompt": [{"command": "echo 'not today' >&2; exit 2", "name": "gate"}]})
    with ScriptedServer([Reply("never")]) as server:
        result = run_cli("hello", *attached(server.url))
        assert server.requests == []
    assert result.exit_code == 1
    (hook,) = result.of_type("hook")
    assert hook["name"] == "gate" and hook["hook_event"] == "user_prompt"
    assert hook["outcome"] == "blocked" and hook["message"] == "not today"
    assert hook["source"] == "user" and hook["duration_s"] >= 0
    assert "Your prompt was not sent" in result.final["final_message"]


def test_the_progress_printer_shows_blocks_and_context_and_keeps_quiet_otherwise():
    out = io.StringIO()
    printer = ProgressPrinter(out)
    base = {"command": "./check.sh", "source": "user", "duration_s": 0.1}
    printer(HookRun(name="guard", hook_event="pre_tool", outcome="blocked", tool="shell",
                    message="no pushes\nsecond line", **base))  # fmt: skip
    printer(HookRun(name="ctx", hook_event="user_prompt", outcome="allowed", message="Branch x",
                    **base))  # fmt: skip
    printer(HookRun(name="quiet", hook_event="post_tool", outcome="allowed", **base))
    assert out.getvalue().splitlines() == [
        "[hook guard (pre_tool shell) blocked: no pushes]",
        "[hook ctx (user_prompt) added context: Branch x]",
    ]
