"""Running one hook: exit codes, stdin, caps, timeouts and interrupts that stop the whole group."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from agent.core.hooks.config import Hook
from agent.core.hooks.dispatch import context_of, judge
from agent.core.hooks.runner import OUTPUT_LIMIT, Confinement, run_hook, run_hook_process


def run(command: str, cwd: Path, stdin: bytes = b"", timeout_s: float = 10.0, cancel=None):
    return run_hook_process(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        env=dict(os.environ),
        stdin=stdin,
        timeout_s=timeout_s,
        cancel=cancel,
        kill_grace_s=0.5,
    )


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def hook(event: str = "pre_tool", timeout: float = 10.0, command: str = "true") -> Hook:
    return Hook(event, command, "user", Path("/cfg/hooks.json"), 0, timeout=timeout, name="h")


def test_exit_codes_and_streams_are_kept_apart(tmp_path):
    ok = run("echo out; echo err >&2; exit 0", tmp_path)
    assert (ok.exit_code, ok.stdout, ok.stderr) == (0, "out\n", "err\n")
    assert judge(hook(), ok).outcome == "allowed"

    blocked = judge(hook(), run("echo 'not on main' >&2; exit 2", tmp_path))
    assert (blocked.outcome, blocked.reason) == ("blocked", "not on main")

    other = judge(hook(), run("echo boom >&2; exit 3", tmp_path))
    assert other.outcome == "warning" and other.problem == "exited with status 3: boom"

    missing = judge(hook(), run("/no/such/program", tmp_path))
    assert missing.outcome == "warning" and "status 127" in missing.problem

    session = judge(hook("session_start"), run("echo nope >&2; exit 2", tmp_path))
    assert session.outcome == "warning" and "cannot block at session_start" in session.problem


def test_a_hook_that_cannot_start_is_a_warning(tmp_path):
    result = run_hook_process(["/no/such/shell"], cwd=tmp_path, env={}, stdin=b"", timeout_s=5)
    assert result.exit_code is None and "cannot start" in (result.error or "")
    assert judge(hook(), result).outcome == "warning"


def test_the_event_arrives_whole_on_stdin_and_runs_in_the_workspace(tmp_path):
    payload = {"event": "pre_tool", "tool": {"name": "shell", "arguments": {"command": "ls"}}}
    data = (json.dumps(payload) + "\n").encode()
    result = run("cat > got.json; pwd", tmp_path, stdin=data)
    assert result.exit_code == 0
    assert json.loads((tmp_path / "got.json").read_text()) == payload
    assert result.stdout.strip() == str(tmp_path)


def test_a_hook_that_ignores_a_large_stdin_does_not_hang(tmp_path):
    started = time.monotonic()
    result = run("exit 0", tmp_path, stdin=b"x" * 4_000_000)
    assert result.exit_code == 0 and time.monotonic() - started < 5


def test_huge_output_is_capped_to_its_head_and_tail(tmp_path):
    command = "head -c 20000000 /dev/zero | tr '\\0' a; head -c 20000000 /dev/zero | tr '\\0' b >&2"
    result = run(command, tmp_path, timeout_s=60)
    assert result.exit_code == 0 and result.truncated
    for text, letter in ((result.stdout, "a"), (result.stderr, "b")):
        assert len(text) < OUTPUT_LIMIT + 200
        assert text.startswith(letter * 100) and text.endswith(letter * 100)
        assert "bytes omitted from the middle" in text


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = run(f"sleep 60 & echo $! > {pid_file}; sleep 60", tmp_path, timeout_s=1)
    assert result.timed_out and time.monotonic() - started < 8
    assert judge(hook(timeout=1), result).outcome == "timeout"
    assert wait_gone(int(pid_file.read_text()))


def test_a_group_that_ignores_sigterm_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    command = f"trap '' TERM; (trap '' TERM; sleep 60) & echo $! > {pid_file}; sleep 60"
    result = run(command, tmp_path, timeout_s=1)
    assert result.timed_out
    assert wait_gone(int(pid_file.read_text()))


def test_what_a_finished_hook_left_running_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = run(f"sleep 60 & echo $! > {pid_file}; echo done", tmp_path, timeout_s=30)
    assert result.exit_code == 0 and result.stdout == "done\n" and not result.timed_out
    assert time.monotonic() - started < 5  # the background sleep held the pipes
    assert wait_gone(int(pid_file.read_text()))


def test_an_interrupt_stops_a_running_hook(tmp_path):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    result = run("sleep 60", tmp_path, timeout_s=30, cancel=cancel)
    assert result.cancelled and not result.timed_out and time.monotonic() - started < 5
    ran = judge(hook(), result)
    assert ran.outcome == "warning" and ran.interrupted


def test_run_hook_passes_variables_and_kills_on_task_teardown(tmp_path):
    pid_file = tmp_path / "hook.pid"

    async def scenario():
        quick = hook(command="echo $RESIDENT_HOOK_EVENT")
        result = await run_hook(
            quick, tmp_path, Confinement(), b"", {"RESIDENT_HOOK_EVENT": "stop"}
        )
        assert result.stdout == "stop\n"
        slow = hook(command=f"echo $$ > {pid_file}; exec sleep 60", timeout=60)
        task = asyncio.create_task(run_hook(slow, tmp_path, Confinement(), b"", {}))
        while not pid_file.exists() or not pid_file.read_text().strip():
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert wait_gone(int(pid_file.read_text()))


@pytest.mark.parametrize(
    ("stdout", "event", "expected"),
    [
        ('{"additional_context": "use pnpm"}', "pre_tool", "use pnpm"),
        ('{"additional_context": "use pnpm"}', "user_prompt", "use pnpm"),
        ('{"other": 1}', "user_prompt", ""),
        ("plain words", "user_prompt", "plain words"),
        ("plain words", "session_start", "plain words"),
        ("plain words", "post_tool", ""),
        ("  \n", "user_prompt", ""),
    ],
)
def test_what_exit_0_adds_for_the_model(stdout, event, expected):
    assert context_of(stdout, event) == expected


def test_added_context_is_capped():
    text = context_of("x" * 50_000, "user_prompt")
    assert len(text) < 8_100 and text.endswith("characters cut]")
