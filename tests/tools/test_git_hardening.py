"""Hardened git: no repository content or config runs a program, and a subdirectory
workspace keeps the git tools inside it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.tools.conftest import commit_all, git, init_repo
from tools import CheckpointError, ToolContext, default_registry, open_checkpoint_store
from tools.git.env import forced_config_env, hardened_git_env
from tools.git.repo import GitError, find_repository, open_repo

HOOK_NAMES = (
    "pre-commit",
    "commit-msg",
    "post-commit",
    "reference-transaction",
    "post-index-change",
    "post-checkout",
)


def _call(workspace: Path, name: str, **arguments):
    return default_registry().call(name, arguments, ToolContext(workspace=workspace))


def _bare_shaped(folder: Path, marker: Path) -> None:
    """A folder git itself would take for a repository, with config that runs a program
    (core.worktree makes git treat it as a work tree of its own, as the attack did)."""
    (folder / "objects").mkdir(parents=True)
    (folder / "refs" / "heads").mkdir(parents=True)
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        f"\tworktree = {folder}\n"
        f'\tfsmonitor = "touch {marker}; false"\n'
        f'\tsshCommand = "touch {marker}"\n\tpager = "touch {marker}"\n'
    )
    _hooks(folder / "hooks", marker)


def _hooks(directory: Path, marker: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in HOOK_NAMES:
        hook = directory / name
        hook.write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        hook.chmod(hook.stat().st_mode | stat.S_IXUSR)


def _exercise_everything(workspace: Path, data_dir: Path) -> list[str]:
    """Every read tool and every checkpoint operation, from `workspace`; what went wrong
    (callers check their marker file first: that is the attack's evidence)."""
    failures = []
    for name, arguments in [
        ("git_status", {}),
        ("git_diff", {}),
        ("git_diff", {"staged": True}),
        ("git_diff", {"ref": "HEAD", "stat": True}),
        ("git_log", {}),
    ]:
        result = _call(workspace, name, **arguments)
        if not result.ok:
            failures.append(f"{name} {arguments}: {result.output}")
    try:
        store = open_checkpoint_store(workspace, data_dir)
        checkpoint = store.create("before")
        (workspace / "scratch.txt").write_text("new\n")
        store.changes(checkpoint.id)
        report = store.restore(checkpoint.id)
        if store.kind != "git" or "scratch.txt" not in " ".join(report.deleted):
            failures.append(f"checkpoints: {store.kind} store, restore deleted {report.deleted}")
        store.list()
        store.delete(checkpoint.id)
    except CheckpointError as exc:
        failures.append(f"checkpoints: {exc}")
    return failures


@pytest.fixture
def project(tmp_path) -> Path:
    repo = init_repo(tmp_path / "project")
    (repo / "app.py").write_text("print(1)\n")
    commit_all(repo, "first")
    (repo / "app.py").write_text("print(2)\n")
    return repo


@pytest.mark.parametrize("where", ["inside the folder", "at the top level"])
def test_a_bare_shaped_folder_never_runs_its_config(project, tmp_path, where):
    marker = tmp_path / "pwned"
    _bare_shaped(project / "evil", marker)
    workspace = project / "evil" if where == "inside the folder" else project
    failures = _exercise_everything(workspace, tmp_path / "data")
    result = _call(workspace, "git_commit", message="from the workspace", stage_all=True)
    assert not marker.exists()
    assert not failures and result.ok, (failures, result.output)
    assert find_repository(workspace).git_dir == project / ".git"
    assert "evil/HEAD" in git(project, "show", "--name-only", "--format=", "HEAD")


def test_a_bare_shaped_workspace_outside_any_repository_is_not_a_repository(tmp_path):
    marker = tmp_path / "pwned"
    folder = tmp_path / "lonely"
    _bare_shaped(folder, marker)
    result = _call(folder, "git_status")
    kind = open_checkpoint_store(folder, tmp_path / "data").kind
    assert not marker.exists()
    assert not result.ok and "not inside a git repository" in result.output
    assert kind == "copy" and find_repository(folder) is None


def test_the_repositorys_own_config_and_hooks_run_nothing_but_the_approved_commit(
    project, tmp_path
):
    marker = tmp_path / "pwned"
    hook_marker = tmp_path / "hooks-ran"
    git(project, "config", "core.fsmonitor", f"touch {marker}; false")
    git(project, "config", "core.sshCommand", f"touch {marker}")
    git(project, "config", "gpg.program", f"touch {marker}")
    git(project, "config", "log.showSignature", "true")
    _hooks(project / ".git" / "hooks", hook_marker)
    failures = _exercise_everything(project, tmp_path / "data")
    assert not marker.exists() and not hook_marker.exists()
    assert not failures
    result = _call(project, "git_commit", message="approved", stage_all=True)
    assert result.ok, result.output
    assert "pre-commit" in hook_marker.read_text()  # the approved commit runs hooks
    assert not marker.exists()


def test_inherited_git_variables_do_not_redirect_the_tools(project, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    _bare_shaped(tmp_path / "elsewhere", marker)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "elsewhere" / "index"))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='touch {marker}; false'")
    status = _call(project, "git_status")
    failures = _exercise_everything(project, tmp_path / "data")
    assert not marker.exists()
    assert not failures and status.ok and " M app.py" in status.output


# -- a workspace that is a subdirectory of its repository -------------------


@pytest.fixture
def sub(tmp_path) -> Path:
    """repo/secret.txt outside the workspace repo/ws; both have history and changes."""
    repo = init_repo(tmp_path / "repo")
    (repo / "secret.txt").write_text("TOP SECRET v1\n")
    (repo / "ws").mkdir()
    (repo / "ws" / "a.py").write_text("a = 1\n")
    commit_all(repo, "first")
    (repo / "secret.txt").write_text("TOP SECRET v2\n")
    commit_all(repo, "secret only")
    (repo / "ws" / "a.py").write_text("a = 2\n")
    commit_all(repo, "workspace only")
    (repo / "secret.txt").write_text("TOP SECRET v3\n")
    (repo / "ws" / "a.py").write_text("a = 3\n")
    (repo / "untracked_secret.txt").write_text("TOP SECRET untracked\n")
    return repo / "ws"


def _hidden(output: str) -> bool:
    return "secret" not in output.lower()


def test_subdirectory_status_lists_only_the_workspace(sub):
    result = _call(sub, "git_status")
    assert result.ok and " M a.py" in result.output
    assert _hidden(result.output)


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"stat": True},
        {"ref": "HEAD~2"},
        {"ref": "HEAD~2", "stat": True},
        {"paths": ["a.py"]},
        {"paths": ["."]},
        {"paths": [":/"]},
    ],
)
def test_subdirectory_diff_shows_only_the_workspace(sub, arguments):
    result = _call(sub, "git_diff", **arguments)
    assert result.ok, result.output
    assert _hidden(result.output)
    if arguments.get("paths") != [":/"]:
        assert "a.py" in result.output and "ws/a.py" not in result.output  # workspace-relative


def test_subdirectory_staged_diff_shows_only_the_workspace(sub):
    repo = sub.parent
    git(repo, "add", "secret.txt", "ws/a.py")
    for arguments in ({"staged": True}, {"staged": True, "ref": "HEAD~1"}):
        result = _call(sub, "git_diff", **arguments)
        assert result.ok and "+a = 3" in result.output and _hidden(result.output)


@pytest.mark.parametrize(
    "ref", ["HEAD:../secret.txt", "HEAD:secret.txt", ":/secret", "HEAD:./", ":secret.txt"]
)
def test_refs_cannot_name_files(sub, ref):
    result = _call(sub, "git_diff", ref=ref)
    assert not result.ok and _hidden(result.output.replace(ref, ""))


def test_subdirectory_paths_outside_are_refused(sub):
    for name, arguments in [
        ("git_diff", {"paths": ["../secret.txt"]}),
        ("git_log", {"path": "../secret.txt"}),
        ("git_commit", {"message": "m", "paths": ["../secret.txt"]}),
    ]:
        result = _call(sub, name, **arguments)
        assert not result.ok and "outside the workspace" in result.output


def test_subdirectory_log_shows_only_commits_touching_the_workspace(sub):
    result = _call(sub, "git_log")
    subjects = [line.split(": ", 1)[1] for line in result.output.splitlines()]
    assert subjects == ["workspace only", "first"]
    assert _call(sub, "git_log", path=":/").output == "(no commits match)"


def test_subdirectory_commit_touches_only_the_workspace(sub):
    repo = sub.parent
    git(repo, "add", "secret.txt")  # the user's own staged change outside
    head = git(repo, "rev-parse", "HEAD")
    refused = _call(sub, "git_commit", message="m", stage_all=True)
    assert not refused.ok and "outside the workspace" in refused.output
    assert _hidden(refused.output.replace("outside the workspace", ""))
    assert git(repo, "rev-parse", "HEAD") == head
    git(repo, "reset", "-q", "secret.txt")
    result = _call(sub, "git_commit", message="ws change", stage_all=True)
    assert result.ok, result.output
    assert git(repo, "show", "--name-only", "--format=", "HEAD").split() == ["ws/a.py"]
    assert " a.py |" in result.output and _hidden(result.output)
    assert "untracked_secret.txt" in git(repo, "status", "--short")  # left alone


# -- finding the repository -------------------------------------------------


def test_linked_worktrees_and_separate_git_dirs_are_found(tmp_path):
    main = init_repo(tmp_path / "main")
    (main / "f.txt").write_text("1\n")
    commit_all(main)
    git(main, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "wt"))
    worktree = find_repository(tmp_path / "wt")
    assert worktree.work_tree == tmp_path / "wt" and worktree.git_dir.parent.name == "worktrees"
    (tmp_path / "wt" / "f.txt").write_text("2\n")
    status = _call(tmp_path / "wt", "git_status")
    assert "## feature" in status.output and " M f.txt" in status.output
    separate = tmp_path / "separate"
    git(tmp_path, "init", "-q", f"--separate-git-dir={tmp_path / 'store.git'}", str(separate))
    assert find_repository(separate).git_dir == tmp_path / "store.git"
    assert _call(separate, "git_status").ok


def test_a_workspace_inside_the_git_directory_is_not_a_work_tree(project, tmp_path):
    assert find_repository(project / ".git" / "refs") is None
    assert open_checkpoint_store(project / ".git" / "refs", tmp_path / "data").kind == "copy"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_a_repository_another_user_owns_is_refused_as_git_would(project, monkeypatch):
    monkeypatch.delenv("SUDO_UID", raising=False)
    for path in (project, project / ".git"):
        os.chown(path, 12345, 12345)
    with pytest.raises(GitError, match="dubious ownership"):
        open_repo(project)


# -- the environment itself -------------------------------------------------


def test_forced_config_turns_hooks_and_signing_off_except_for_the_approved_commit():
    def pairs(env):
        count = int(env["GIT_CONFIG_COUNT"])
        return {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(count)}

    plain, approved = pairs(forced_config_env()), pairs(forced_config_env(hooks=True))
    assert plain["core.hooksPath"] == os.devnull and plain["commit.gpgSign"] == "false"
    assert "core.hooksPath" not in approved and "commit.gpgSign" not in approved
    for config in (plain, approved):
        assert config["safe.bareRepository"] == "explicit"
        assert config["core.fsmonitor"] == "false" and config["core.pager"] == "cat"


def test_hardened_env_drops_redirecting_variables(tmp_path):
    base = {
        "PATH": "/bin",
        "GIT_DIR": "/elsewhere",
        "GIT_CONFIG_PARAMETERS": "'core.fsmonitor'='x'",
        "GIT_CONFIG_KEY_40": "core.fsmonitor",
        "GIT_SSH_COMMAND": "x",
    }
    env = hardened_git_env(base, git_dir=tmp_path / ".git", work_tree=tmp_path)
    assert env["PATH"] == "/bin" and env["GIT_DIR"] == str(tmp_path / ".git")
    assert env["GIT_WORK_TREE"] == str(tmp_path)
    assert env["GIT_CEILING_DIRECTORIES"] == str(tmp_path.parent)
    assert not {"GIT_CONFIG_PARAMETERS", "GIT_CONFIG_KEY_40", "GIT_SSH_COMMAND"} & set(env)
