"""git tools: status, diff, log, and commits that run the repository's hooks."""

from __future__ import annotations

import os
import stat

import pytest

from tests.tools.conftest import commit_all, git, init_repo
from tools import ToolContext, default_registry


@pytest.fixture
def repo(workspace):
    init_repo(workspace)
    (workspace / "a.py").write_text("x = 1\n")
    (workspace / "b.py").write_text("y = 1\n")
    commit_all(workspace, "first")
    (workspace / "a.py").write_text("x = 2\n")
    commit_all(workspace, "second")
    return workspace


def _hook(repo, name: str, body: str) -> None:
    hook = repo / ".git" / "hooks" / name
    hook.write_text("#!/bin/sh\n" + body)
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)


def test_status_shows_branch_and_changes(call, repo):
    (repo / "a.py").write_text("x = 3\n")
    (repo / "new.py").write_text("z\n")
    result = call("git_status")
    assert result.ok
    assert (
        "## main" in result.output and " M a.py" in result.output and "?? new.py" in result.output
    )


def test_diff_work_tree_staged_and_against_a_ref(call, repo):
    (repo / "a.py").write_text("x = 3\n")
    work = call("git_diff")
    assert "-x = 2" in work.output and "+x = 3" in work.output
    assert call("git_diff", staged=True).output == "(no differences)"
    git(repo, "add", "a.py")
    assert "+x = 3" in call("git_diff", staged=True).output
    against = call("git_diff", ref="HEAD~1")
    assert "-x = 1" in against.output and "+x = 3" in against.output
    assert "a.py" in call("git_diff", ref="HEAD~1", stat=True).output
    assert call("git_diff", ref="HEAD~1", paths=["b.py"]).output == "(no differences)"


@pytest.mark.parametrize("ref", ["--output=/tmp/pwned", "-p", "HEAD;rm", "no-such-branch", "a..b"])
def test_diff_refuses_bad_refs(call, repo, ref):
    result = call("git_diff", ref=ref)
    assert not result.ok
    assert not os.path.exists("/tmp/pwned")


def test_diff_paths_are_confined(call, repo, outside):
    result = call("git_diff", paths=["../outside/secret.txt"])
    assert not result.ok and "outside the workspace" in result.output


def test_log(call, repo):
    result = call("git_log")
    lines = result.output.splitlines()
    assert len(lines) == 2 and lines[0].endswith("Test User: second")
    assert len(call("git_log", max_count=1).output.splitlines()) == 1
    assert call("git_log", path="b.py").output.endswith("first")


def test_log_and_status_in_a_repository_without_commits(call, workspace):
    init_repo(workspace)
    assert call("git_log").output == "(no commits yet)"
    assert call("git_status").ok


def test_outside_a_repository(call):
    result = call("git_status")
    assert not result.ok and "not inside a git repository" in result.output


def test_commit_runs_hooks(call, repo):
    _hook(repo, "pre-commit", "echo hook-ran > .git/hook-marker\necho 'checking style'\n")
    (repo / "a.py").write_text("x = 4\n")
    result = call("git_commit", message="update a", paths=["a.py"])
    assert result.ok, result.output
    assert (repo / ".git" / "hook-marker").exists()
    assert "checking style" in result.output
    assert git(repo, "log", "-1", "--format=%s").strip() == "update a"
    assert result.data["commit"] == git(repo, "rev-parse", "HEAD").strip()


def test_a_failing_hook_blocks_the_commit(call, repo):
    head = git(repo, "rev-parse", "HEAD")
    _hook(repo, "pre-commit", "echo 'lint failed: a.py' >&2\nexit 1\n")
    (repo / "a.py").write_text("x = 5\n")
    result = call("git_commit", message="bad", stage_all=True)
    assert not result.ok
    assert "lint failed: a.py" in result.output and "nothing was committed" in result.output
    assert git(repo, "rev-parse", "HEAD") == head


def test_no_verify_skips_hooks_only_when_asked(call, repo):
    _hook(repo, "pre-commit", "echo ran > .git/hook-marker\nexit 1\n")
    (repo / "a.py").write_text("x = 6\n")
    result = call("git_commit", message="skip hooks", stage_all=True, no_verify=True)
    assert result.ok
    assert not (repo / ".git" / "hook-marker").exists()


def test_hooks_do_not_see_secrets(repo):
    env = {**os.environ, "OPENAI_API_KEY": "sk-leak", "RESIDENT_API_KEY": "resident-leak"}
    ctx = ToolContext(workspace=repo, env=env)
    _hook(repo, "pre-commit", "env > .git/hook-env\n")
    (repo / "a.py").write_text("x = 7\n")
    assert default_registry().call("git_commit", {"message": "m", "stage_all": True}, ctx).ok
    seen = (repo / ".git" / "hook-env").read_text()
    assert "sk-leak" not in seen and "resident-leak" not in seen


def test_commit_with_nothing_staged_fails_cleanly(call, repo):
    result = call("git_commit", message="empty")
    assert not result.ok and "nothing" in result.output.lower()
    assert call("git_commit", message="empty", allow_empty=True).ok


def test_commit_paths_are_confined(call, repo):
    result = call("git_commit", message="m", paths=["../outside"])
    assert not result.ok and "outside the workspace" in result.output


def test_commit_message_starting_with_a_dash_is_just_a_message(call, repo):
    (repo / "a.py").write_text("x = 8\n")
    assert call("git_commit", message="--amend", stage_all=True).ok
    assert git(repo, "log", "-1", "--format=%s").strip() == "--amend"
    assert len(git(repo, "log", "--format=%h").split()) == 3
