"""`resident run` end to end against the scripted server: tasks, events, exit codes."""

from __future__ import annotations

import json

from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, Status, call


def fix_script() -> list[Reply]:
    return [
        Reply("Let me look.", [call("read", path="calc.py")]),
        Reply(
            "", [call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")]
        ),
        Reply("Fixed `add`: it subtracted instead of adding."),
    ]


def test_task_reads_edits_and_finishes(repo):
    with ScriptedServer(fix_script()) as server:
        result = run_cli("fix add", *attached(server.url, "--approval", "auto-edit"))
    assert result.exit_code == 0, result.stderr
    assert "return a + b" in (repo / "calc.py").read_text()
    final = result.final
    assert final["exit_code"] == 0
    assert final["final_message"] == "Fixed `add`: it subtracted instead of adding."
    results = result.of_type("tool_result")
    assert [r["ok"] for r in results] == [True, True]
    assert "-    return a - b" in results[1]["output"] or "return a + b" in results[1]["output"]
    # A checkpoint before the first edit, none before the read.
    types = result.types()
    assert types.index("checkpoint") > types.index("tool_result")
    assert len(result.of_type("checkpoint")) == 1


def test_event_order_and_seq(repo):
    with ScriptedServer(fix_script()) as server:
        result = run_cli("fix add", *attached(server.url, "--approval", "auto-edit"))
    seqs = [e["seq"] for e in result.events]
    assert seqs == list(range(1, len(seqs) + 1))
    types = result.types()
    assert types[:4] == ["session_started", "context_snapshot", "user_message", "turn_started"]
    assert types[-1] == "session_completed"
    assert types.count("turn_started") == types.count("turn_completed") == 3
    calls_and_results = [
        t for t in types if t in ("tool_call", "tool_result", "approval_requested")
    ]
    assert calls_and_results == ["tool_call", "tool_result"] * 2  # auto-edit asks nothing
    usage = result.of_type("usage")[0]
    assert usage["context_window"] == 32768
    assert usage["cached_tokens"] is not None and usage["resident_tokens"] > 0
    snapshot = result.of_type("context_snapshot")[0]
    assert snapshot["mode"] == "full" and snapshot["files"] == 3
    assert snapshot["token_count"] == "estimate"


def test_each_prompt_extends_the_previous_one(repo):
    with ScriptedServer(fix_script()) as server:
        run_cli("fix add", *attached(server.url, "--approval", "auto-edit"))
    prompts = [r["messages"] for r in server.requests]
    assert len(prompts) == 3
    # Turn 2 extends turn 1. The edit changed a third of this tiny repository, past
    # the staleness threshold, so turn 3 starts a new epoch with the file as it is now.
    assert prompts[1][: len(prompts[0])] == prompts[0]
    assert prompts[2][1:4] == prompts[1][1:4]
    assert "return a + b" in prompts[2][0]["content"]
    assert 'epoch="2"' in prompts[2][0]["content"]
    system = prompts[0][0]
    assert system["role"] == "system"
    assert '<file path="calc.py"' in system["content"]
    tools = [t["function"]["name"] for t in server.requests[0]["tools"]]
    assert tools == sorted(tools)
    assert all(r["tools"] == server.requests[0]["tools"] for r in server.requests)


def test_text_mode_prints_the_final_message_on_stdout(repo):
    with ScriptedServer([Reply("All good.")]) as server:
        result = run_cli("check", "--attach", server.url)
    assert result.exit_code == 0
    assert result.stdout.strip() == "All good."
    assert "session" in result.stderr


def test_task_from_stdin(repo):
    with ScriptedServer([Reply("Read it.")]) as server:
        result = run_cli("-", *attached(server.url), input="what does calc do?\n")
    assert result.exit_code == 0
    assert server.requests[0]["messages"][-1] == {"role": "user", "content": "what does calc do?\n"}


def test_edit_needing_approval_exits_3(repo):
    with ScriptedServer(fix_script()) as server:
        result = run_cli("fix add", *attached(server.url))  # headless default: ask
    assert result.exit_code == 3
    assert "return a - b" in (repo / "calc.py").read_text()
    types = result.types()
    assert "approval_requested" in types
    resolved = result.of_type("approval_resolved")[0]
    assert resolved == {**resolved, "approved": False, "by": "unavailable"}
    assert result.final["exit_code"] == 3
    assert "--approval" in result.final["final_message"]
    assert len(server.requests) == 2  # it stopped instead of asking the model again


def test_read_only_denies_edit_and_tells_the_model(repo):
    script = fix_script()[1:] + [Reply("I may not edit in read-only mode.")]
    with ScriptedServer(script) as server:
        result = run_cli("fix add", *attached(server.url, "--approval", "read-only"))
    assert result.exit_code == 0
    denied = result.of_type("tool_result")[0]
    assert not denied["ok"] and "Denied" in denied["output"]
    tool_message = server.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "Denied" in tool_message["content"]


def test_max_turns(repo):
    with ScriptedServer([Reply("", [call("list")])], repeat_last=True) as server:
        result = run_cli("loop forever", *attached(server.url, "--max-turns", "2"))
    assert result.exit_code == 1
    assert len(server.requests) == 2
    assert result.of_type("error")[-1]["kind"] == "max_turns"


def test_retries_503_and_429_then_succeeds(repo):
    script = [Status(503), Status(429), Reply("Done after retries.")]
    with ScriptedServer(script) as server:
        result = run_cli("hi", *attached(server.url))
    assert result.exit_code == 0
    assert result.final["final_message"] == "Done after retries."
    assert len(server.requests) == 3


def test_unreachable_server_exits_75(repo, monkeypatch):
    from agent.core.clients import http

    monkeypatch.setattr(http, "DEFAULT_RETRY", http.RetryPolicy(base_delay_s=0.01))
    result = run_cli("hi", "--attach", "http://127.0.0.1:9", "--json")
    assert result.exit_code == 75
    assert result.final["exit_code"] == 75
    assert "cannot reach" in result.stderr


def test_rejected_api_key_says_so(repo):
    with ScriptedServer([Reply("hi")], api_key="right") as server:
        result = run_cli("hi", "--attach", server.url, "--api-key", "wrong")
        assert result.exit_code == 1
        assert "rejected the API key" in result.stderr
        ok = run_cli("hi", "--attach", server.url, "--api-key", "right")
        assert ok.exit_code == 0


def test_context_window_from_flag_when_server_has_no_stats(repo):
    with ScriptedServer([Reply("hi")], publish_stats=False) as server:
        missing = run_cli("hi", "--attach", server.url)
        assert missing.exit_code == 2
        assert "--context-window" in missing.stderr
        # Room for the fixed prefix (system prompt and every tool's schema) and a turn.
        given = run_cli("hi", *attached(server.url, "--context-window", "8192"))
    assert given.exit_code == 0
    assert given.of_type("session_started")[0]["context_window"] == 8192


def test_usage_errors_exit_2(repo):
    assert run_cli("hi", "--approval", "sometimes").exit_code == 2
    assert run_cli("  ").exit_code == 2
    with ScriptedServer([]) as server:
        unknown = run_cli("hi", "--resume", "nope", *attached(server.url))
    assert unknown.exit_code == 2
    assert "no session 'nope'" in unknown.final["final_message"]


def test_resume_continues_the_conversation(repo):
    with ScriptedServer([Reply("First answer.")]) as server:
        first = run_cli("first question", *attached(server.url))
    session_id = first.of_type("session_started")[0]["session_id"]
    last_seq = first.events[-1]["seq"]
    with ScriptedServer([Reply("Second answer.")]) as server:
        second = run_cli("second question", *attached(server.url, "--resume", session_id))
    assert second.exit_code == 0
    started = second.of_type("session_started")[0]
    assert started["session_id"] == session_id and started["resumed"] is True
    assert second.events[0]["seq"] == last_seq + 1
    conversation = server.requests[0]["messages"][1:]
    assert conversation == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "second question"},
    ]


def test_sessions_are_listed(repo):
    from typer.testing import CliRunner

    from agent.cli import app

    with ScriptedServer([Reply("x")]) as server:
        run_cli("list me", *attached(server.url))
    listing = CliRunner().invoke(app, ["sessions", "--json"])
    assert listing.exit_code == 0
    entries = json.loads(listing.stdout)
    assert len(entries) == 1 and entries[0]["title"] == "list me"


def test_missing_local_model_names_the_pull_command(repo, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    result = run_cli("hi", "--json")
    assert result.exit_code == 1
    assert "resident models pull" in result.final["final_message"]
    assert "Traceback" not in result.stderr


def test_multi_step_task_reads_edits_runs_tests_and_commits(repo):
    """read -> edit -> run the tests -> commit leaves the repository in the expected state."""
    import shlex
    import subprocess
    import sys

    pytest_command = f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider test_calc.py"
    script = fix_script()[:2] + [
        Reply("Running the tests.", [call("shell", command=pytest_command)]),
        Reply("", [call("git_commit", message="Fix add", paths=["calc.py"])]),
        Reply("Fixed add, tests pass, committed."),
    ]
    with ScriptedServer(script) as server:
        result = run_cli("fix add and commit", *attached(server.url, "--approval", "full-auto"))
    assert result.exit_code == 0, result.stderr
    outcomes = result.of_type("tool_result")
    assert [r["ok"] for r in outcomes] == [True, True, True, True]
    assert "2 passed" in outcomes[2]["output"]
    log = subprocess.run(
        ["git", "log", "--format=%s"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert log[0] == "Fix add"
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert "calc.py" not in status
    assert "return a + b" in (repo / "calc.py").read_text()
