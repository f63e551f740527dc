"""Resident's configuration and state as a trust zone: where it is, what the policy says, what
the file tools and the sandbox do about it, wherever the workspace lies."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools import ToolContext, default_registry
from tools.base import Effect, ToolAccess
from tools.permissions.policy import ApprovalMode, PermissionPolicy, Verdict
from tools.sandbox.bubblewrap import SandboxUnavailable, detect_sandbox
from tools.sandbox.grants import SandboxGrant
from tools.workspace.protected import find_state_dirs

MODES = list(ApprovalMode)
WRITING_MODES = [ApprovalMode.ASK, ApprovalMode.AUTO_EDIT, ApprovalMode.FULL_AUTO]


@pytest.fixture
def home(tmp_path) -> Path:
    """A workspace that is the user's home: the config folder lies inside it."""
    path = Path(os.path.realpath(tmp_path / "home"))
    (path / ".config" / "resident").mkdir(parents=True)
    (path / ".config" / "resident" / "hooks.json").write_text('{"hooks": {}}\n')
    return path


def home_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": os.defpath}


def policy(home: Path, mode: ApprovalMode, **rules) -> PermissionPolicy:
    ctx = ToolContext(workspace=home, env=home_env(home))
    return PermissionPolicy.for_context(ctx, mode, **rules)


def write(path: str) -> ToolAccess:
    return ToolAccess(effect=Effect.WRITE, summary=f"Write {path}", paths=(path,))


def test_state_dirs_follow_the_overrides_then_xdg_then_home(tmp_path):
    env = {
        "HOME": str(tmp_path / "h"),
        "RESIDENT_CONFIG_DIR": str(tmp_path / "cfg"),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
    }
    found = {d.path: d for d in find_state_dirs(env)}
    real = Path(os.path.realpath(tmp_path))
    assert found[real / "cfg"].private and "configuration" in found[real / "cfg"].what
    assert real / "h" / ".config" / "resident" in found
    assert found[real / "xdg-data" / "resident"].private
    assert not found[real / "h" / ".cache" / "resident"].private  # the cache holds no tokens


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "target",
    [".config/resident/hooks.json", ".config/resident/trusted-hooks.json",
     ".local/share/resident/sessions/x/messages.jsonl", ".cache/resident/kernels/x.so"],
)  # fmt: skip
def test_no_mode_and_no_rule_lets_a_file_tool_write_the_users_state(home, mode, target):
    decision = policy(home, mode, allow=("*", "write", f"write:{target}")).check_access(
        "write", write(target)
    )
    assert decision.verdict is Verdict.DENY, decision
    if not mode.read_only:  # there the mode alone already says no
        assert "no tool the model drives changes it" in decision.reason


def test_a_link_into_the_config_folder_leads_nowhere_writable(home):
    (home / "cfg").symlink_to(home / ".config" / "resident")
    decision = policy(home, ApprovalMode.FULL_AUTO).check_access("write", write("cfg/x.json"))
    assert decision.verdict is Verdict.DENY


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "target", [".resident/mcp.json", ".resident/commands/review.md", ".residentignore",
               "sub/.resident/hooks.json"],
)  # fmt: skip
def test_project_config_is_asked_for_by_name_every_time(home, mode, target):
    decision = policy(home, mode, allow=("*", "write")).check_access("write", write(target))
    if mode.read_only:
        assert decision.verdict is Verdict.DENY
        return
    assert decision.verdict is Verdict.ASK and decision.once, decision
    assert target.split("/")[-1] in decision.request
    assert "asked for by name" in decision.reason


def test_a_deny_rule_still_denies_project_config(home):
    decision = policy(home, ApprovalMode.FULL_AUTO, deny=("write:.resident/**",)).check_access(
        "write", write(".resident/mcp.json")
    )
    assert decision.verdict is Verdict.DENY and "rule" in decision.reason


def test_reading_the_config_asks_and_reading_the_cache_does_not(home):
    read = policy(home, ApprovalMode.FULL_AUTO)
    config = ToolAccess(Effect.READ, "Read", paths=(".config/resident/hooks.json",))
    (home / ".cache" / "resident").mkdir(parents=True)
    cache = ToolAccess(Effect.READ, "Read", paths=(".cache/resident",))
    assert read.check_access("read", config).verdict is Verdict.ASK
    assert read.check_access("read", cache).verdict is Verdict.ALLOW


def test_the_file_tools_refuse_the_state_even_when_called_directly(home):
    ctx = ToolContext(workspace=home, env=home_env(home))
    result = default_registry().call(
        "write", {"path": ".config/resident/mcp.json", "content": "{}"}, ctx
    )
    assert not result.ok and "file tools never change it" in result.output
    assert not (home / ".config" / "resident" / "mcp.json").exists()


@pytest.fixture
def sandbox(home):
    found = detect_sandbox(home)
    if isinstance(found, SandboxUnavailable):
        pytest.skip(found.reason)
    return found


def run(sandbox, home: Path, command: str, grant: SandboxGrant, cwd: Path | None = None):
    argv = sandbox.wrap(
        ["/bin/sh", "-c", command], workspace=home, cwd=cwd or home, grant=grant,
        env=home_env(home),
    )  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_commands_find_the_config_read_only_and_cannot_set_it_aside(sandbox, home):
    hooks = home / ".config" / "resident" / "hooks.json"
    granted = SandboxGrant(write=True, secrets=True)
    attempt = (
        "echo x > .config/resident/hooks.json; mv .config .old; mv .config/resident .r; "
        "rm -rf .config/resident; mkdir -p .local/share/x; mv .local .l; touch .config/own"
    )
    result = run(sandbox, home, attempt, granted)
    assert hooks.read_text() == '{"hooks": {}}\n', result.stderr
    # `mv` of a mount point falls back to copy-and-delete: the copy is no config, the
    # delete fails on the read-only folder, and nothing on the way to it can be renamed.
    assert not (home / ".old").exists() and not (home / ".l").exists()
    assert (home / ".config" / "own").exists()  # the rest of ~/.config stays writable
    # Made before the command, so it could be kept read-only: the data folder.
    assert (home / ".local" / "share" / "resident").is_dir()


def test_unasked_commands_find_the_config_empty(sandbox, home):
    result = run(sandbox, home, "cat .config/resident/hooks.json", SandboxGrant())
    assert result.returncode != 0 and "hooks" not in result.stdout


def test_a_workspace_inside_the_config_folder_is_read_only_whole(sandbox, home):
    inside = home / ".config" / "resident"
    argv = sandbox.wrap(
        ["/bin/sh", "-c", "echo x > new.txt"], workspace=inside, cwd=inside,
        grant=SandboxGrant(write=True, secrets=True), env=home_env(home),
    )  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and not (inside / "new.txt").exists()


def test_a_read_only_command_creates_nothing(sandbox, home):
    run(sandbox, home, "true", SandboxGrant())
    assert not (home / ".local").exists() and not (home / ".cache").exists()
