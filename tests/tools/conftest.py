"""Fixtures for the tools tests: a workspace, a directory outside it, a context, git repos."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools import ToolContext, ToolLimits, ToolResult, default_registry


@pytest.fixture(autouse=True)
def isolated_git_config(tmp_path_factory, monkeypatch):
    """Git must not read the developer's config (hooksPath, signing, identity)."""
    home = tmp_path_factory.mktemp("gitconfig")
    config = home / "gitconfig"
    config.write_text(
        "[user]\n\tname = Test User\n\temail = test@example.com\n"
        "[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def workspace(tmp_path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return Path(os.path.realpath(path))


@pytest.fixture
def outside(tmp_path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("TOP SECRET\n")
    return Path(os.path.realpath(path))


@pytest.fixture
def ctx(workspace) -> ToolContext:
    return ToolContext(workspace=workspace, limits=ToolLimits(shell_kill_grace_s=0.3))


@pytest.fixture
def registry():
    return default_registry()


@pytest.fixture
def call(registry, ctx):
    """Run a tool by name with keyword arguments, as the agent would after approval."""

    def run(name: str, **arguments) -> ToolResult:
        return registry.call(name, arguments, ctx)

    return run


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def init_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    return path


def commit_all(path: Path, message: str = "commit") -> str:
    git(path, "add", "-A")
    git(path, "commit", "-q", "--no-verify", "-m", message)
    return git(path, "rev-parse", "HEAD").strip()
