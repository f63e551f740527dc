"""The shell tool: process groups, timeouts that kill everything, output caps, scrubbed env."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tools import ToolContext, ToolLimits, default_registry
from tools.process.environment import is_secret_variable
from tools.process.limits import process_cap_mechanism
from tools.process.output_cap import HeadTailBuffer
from tools.process.run import process_limit, user_task_count
from tools.sandbox.grants import SandboxSettings


def _gone(pid: int, within: float = 3.0) -> bool:
    """True once `pid` no longer exists or is a zombie waiting for init to reap it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _pids(output: str) -> list[int]:
    return [int(word) for word in output.split() if word.isdigit()]


def _shell(ctx, command, **arguments):
    return default_registry().call("shell", {"command": command, **arguments}, ctx)


def test_runs_in_the_workspace_and_reports_the_exit_code(ctx, workspace):
    ok = _shell(ctx, "pwd; echo out; echo err >&2")
    assert ok.ok and ok.data["exit_code"] == 0
    assert str(workspace) in ok.output and "out" in ok.output and "err" in ok.output
    assert ok.output.endswith("[exit code 0]")
    failed = _shell(ctx, "exit 3")
    assert not failed.ok and failed.data["exit_code"] == 3 and "[exit code 3]" in failed.output


def test_workdir_is_confined(ctx, workspace, outside):
    (workspace / "sub").mkdir()
    assert _shell(ctx, "pwd", workdir="sub").output.startswith(str(workspace / "sub"))
    result = _shell(ctx, "pwd", workdir="../outside")
    assert not result.ok and "outside the workspace" in result.output


def test_stdin_is_closed_so_prompts_do_not_hang(ctx):
    # A prompt that waited for input would run into the timeout and fail the call.
    result = _shell(ctx, "cat; read -r answer; echo got:$answer", timeout_s=30)
    assert result.ok and "got:" in result.output


def test_timeout_kills_grandchildren(ctx):
    started = time.monotonic()
    # 2 s: both children must have started and printed their PIDs on a loaded machine.
    result = _shell(
        ctx, "sleep 100 & echo $!; bash -c 'sleep 100 & echo $!; wait' & sleep 100", timeout_s=2
    )
    assert result.data["timed_out"] and not result.ok
    assert "timed out after 2s" in result.output
    pids = _pids(result.output)
    assert len(pids) == 2
    assert all(_gone(pid) for pid in pids)
    assert time.monotonic() - started < 30  # killed, not left to sleep 100 s


def test_a_command_ignoring_sigterm_is_killed(ctx):
    started = time.monotonic()
    result = _shell(ctx, "trap '' TERM; (trap '' TERM; sleep 100) & echo $!; wait", timeout_s=2)
    assert result.data["timed_out"]
    assert result.data["signal"] == 9  # SIGTERM was ignored, SIGKILL was not
    pids = _pids(result.output)
    assert pids and all(_gone(pid) for pid in pids)
    assert time.monotonic() - started < 30


def test_background_children_do_not_outlive_the_call(ctx):
    started = time.monotonic()
    result = _shell(ctx, "sleep 100 & echo $!; echo done")
    assert result.ok and "done" in result.output
    assert _gone(_pids(result.output)[0])
    assert time.monotonic() - started < 30


def cancel_once_written(ctx, pid_file: Path) -> threading.Thread:
    """Set the cancel event once the shell has written its background child's PID."""

    def wait_then_cancel() -> None:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        ctx.cancel_event.set()

    thread = threading.Thread(target=wait_then_cancel, daemon=True)
    thread.start()
    return thread


def test_cancellation_kills_the_group(ctx, workspace):
    pid_file = workspace / "background.pid"
    canceller = cancel_once_written(ctx, pid_file)
    started = time.monotonic()
    result = _shell(ctx, "sleep 100 & echo $! > background.pid; sleep 100", timeout_s=60)
    canceller.join()
    assert result.data["cancelled"] and not result.ok
    assert "interrupted" in result.output
    assert _gone(int(pid_file.read_text()))
    assert time.monotonic() - started < 30
    assert not _shell(ctx, "echo never").ok  # still interrupted: nothing new starts


def test_hundred_megabytes_of_output_keep_head_and_tail(workspace):
    ctx = ToolContext(workspace=workspace, limits=ToolLimits(shell_output_chars=10_000))
    result = default_registry().call(
        "shell", {"command": "echo FIRST; head -c 100000000 /dev/zero | tr '\\0' 'x'; echo; echo LAST"},
        ctx,
    )  # fmt: skip
    assert result.ok and result.truncated
    assert result.output.startswith("FIRST\n")
    assert result.output.rstrip().endswith("LAST\n[exit code 0]".rstrip())
    assert "bytes omitted from the middle" in result.output
    assert result.data["omitted_bytes"] > 99_000_000
    assert len(result.output) < 11_000


def test_head_tail_cut_at_line_boundaries():
    buffer = HeadTailBuffer(2000)
    buffer.feed("".join(f"{i}\n" for i in range(100_000)).encode())
    text = buffer.render()
    assert text.startswith("0\n1\n2\n")
    assert text.endswith("99998\n99999\n")
    head, _, tail = text.partition("[... ")
    assert head.endswith("\n") and tail.split("\n", 1)[1].split("\n")[0].isdigit()
    assert buffer.truncated and buffer.omitted > 0


def test_ansi_escapes_are_stripped(ctx):
    result = _shell(ctx, r"printf '\033[31mred\033[0m plain\n'")
    assert "red plain" in result.output and "\x1b" not in result.output


def test_environment_is_scrubbed_of_secrets(workspace):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(workspace),
        "OPENAI_API_KEY": "sk-openai",
        "ANTHROPIC_API_KEY": "sk-ant",
        "RESIDENT_API_KEY": "resident-key",
        "RESIDENT_ANYTHING": "resident-other",
        "HF_TOKEN": "hf-token",
        "GITHUB_TOKEN": "gh-token",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "MY_SERVICE_API_KEY": "svc-key",
        "DB_PASSWORD": "hunter2",
        "TOKENIZERS_PARALLELISM": "false",
        "LANG": "C.UTF-8",
    }
    env["HTTPS_PROXY"] = "http://user:proxy-pass@proxy:3128"
    env["DATABASE_URL"] = "postgres://u:db-pass@db/x"
    ctx = ToolContext(workspace=workspace, env=env)
    result = default_registry().call("shell", {"command": "env"}, ctx)
    for secret in ("sk-openai", "sk-ant", "resident-key", "resident-other", "hf-token",
                   "gh-token", "aws-secret", "svc-key", "hunter2", "proxy-pass", "db-pass"):  # fmt: skip
        assert secret not in result.output
    # An allow-list: what it does not name stays out unless the user adds it.
    assert "TOKENIZERS_PARALLELISM" not in result.output
    assert "LANG=C.UTF-8" in result.output
    assert "GIT_TERMINAL_PROMPT=0" in result.output
    added = ToolContext(
        workspace=workspace,
        env=env,
        sandbox_settings=SandboxSettings(env_names=("TOKENIZERS_PARALLELISM", "HTTPS_PROXY")),
    )
    output = default_registry().call("shell", {"command": "env"}, added).output
    assert "TOKENIZERS_PARALLELISM=false" in output
    assert "proxy-pass" not in output  # a password in a URL is never passed


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("OPENAI_BASE_URL", True),
        ("HF_TOKEN", True),
        ("NPM_TOKEN", True),
        ("RESIDENT_MODEL", True),
        ("STRIPE_SECRET_KEY", True),
        ("SSH_PRIVATE_KEY", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("PATH", False),
        ("HOME", False),
        # An agent socket lends the user's keys to whoever can reach it.
        ("SSH_AUTH_SOCK", True),
        ("PGPASSWORD", True),
        ("MYSQL_PWD", True),
        ("DATABASE_URL", True),
        ("GH_PAT", True),
        ("SENTRY_DSN", True),
        ("DOCKER_AUTH_CONFIG", True),
        ("PWD", False),
        ("OLDPWD", False),
    ],
)
def test_secret_variable_names(name, secret):
    assert is_secret_variable(name) is secret


def test_process_limit_is_applied(ctx):
    if process_cap_mechanism().startswith("cgroup"):
        result = _shell(
            ctx,
            "cat /proc/self/cgroup; cat /sys/fs/cgroup/pids$(sed -n 's/^[0-9]*:pids://p' /proc/self/cgroup)/pids.max 2>/dev/null || cat /sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/pids.max",
        )
        assert "resident-" in result.output
        assert str(ctx.limits.shell_process_budget) in result.output.splitlines()
        return
    expected = process_limit(ctx.limits.shell_process_budget)
    if expected is None:
        pytest.skip("no /proc to count processes")
    result = _shell(ctx, "ulimit -u")
    applied = int(result.output.splitlines()[0])
    # Other processes may start or stop between the two counts.
    assert abs(applied - expected) <= 50
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    assert soft == resource.RLIM_INFINITY or applied <= soft


# dash reports a failed fork at once (bash would retry for seconds).
_FORK_LOOP = "sh -c 'i=0; while [ $i -lt 200 ]; do sleep 5 & i=$((i+1)); echo $i; done'"


_RUN_AS_USER = """
import sys
sys.path.insert(0, sys.argv[1])
from tools import ToolContext, ToolLimits, default_registry
ctx = ToolContext(workspace=sys.argv[2], limits=ToolLimits(shell_process_budget=20))
command = sys.argv[3]
print(default_registry().call("shell", {"command": command, "timeout_s": 20}, ctx).output)
"""


def test_process_limit_stops_a_fork_bomb(workspace):
    """RLIMIT_NPROC is not enforced for root, so as root the check runs as 'nobody'."""
    if os.geteuid() != 0:
        ctx = ToolContext(workspace=workspace, limits=ToolLimits(shell_process_budget=20))
        output = _shell(ctx, _FORK_LOOP, timeout_s=20).output
    else:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: RLIMIT_NPROC would not be enforced")
        shared = Path(tempfile.mkdtemp(prefix="resident-nproc-"))
        try:
            shared.chmod(0o777)
            repo = str(Path(__file__).resolve().parents[2])
            run = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 sys.executable, "-c", _RUN_AS_USER, repo, str(shared), _FORK_LOOP],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if run.returncode != 0:
                pytest.skip(f"cannot run the tools as nobody here: {run.stderr[-300:]}")
            output = run.stdout
        finally:
            shutil.rmtree(shared, ignore_errors=True)
    assert "fork" in output.lower(), output
    started = [int(line) for line in output.splitlines() if line.strip().isdigit()]
    assert started and max(started) <= 25


def test_task_count_includes_threads():
    release = threading.Event()
    workers = [threading.Thread(target=release.wait) for _ in range(5)]
    for worker in workers:
        worker.start()
    try:
        count = user_task_count()
        if count is None:
            pytest.skip("no /proc to count tasks")
        assert count >= threading.active_count()
    finally:
        release.set()
        for worker in workers:
            worker.join()


def test_async_run_is_interrupted_by_the_cancel_event(ctx, registry, workspace):
    pid_file = workspace / "background.pid"
    command = "sleep 100 & echo $! > background.pid; sleep 100"

    async def scenario():
        task = asyncio.create_task(
            registry.run_async(registry.parse("shell", {"command": command}), ctx)
        )
        canceller = cancel_once_written(ctx, pid_file)
        result = await asyncio.wait_for(task, timeout=40)
        canceller.join()
        return result

    result = asyncio.run(scenario())
    assert result.data["cancelled"]
    assert _gone(int(pid_file.read_text()))


def test_an_endless_flood_of_output_still_times_out(ctx):
    started = time.monotonic()
    result = _shell(ctx, "yes flood", timeout_s=2)  # time to start on a loaded machine
    assert result.data["timed_out"] and result.truncated
    assert "flood" in result.output
    assert time.monotonic() - started < 30
