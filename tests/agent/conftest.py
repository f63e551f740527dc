"""Fixtures for the agent tests: isolated data dir and git config, a small repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CALC = '''"""Tiny calculator."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b
'''
TEST_CALC = """from calc import add, mul


def test_add():
    assert add(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6
"""


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
    """Sessions, checkpoints and the user's config (MCP servers) under tmp; git never
    reads the developer's config."""
    home = tmp_path_factory.mktemp("home")
    config = home / "gitconfig"
    config.write_text(
        "[user]\n\tname = Test User\n\temail = test@example.com\n"
        "[init]\n\tdefaultBranch = main\n[commit]\n\tgpgsign = false\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("RESIDENT_DATA_DIR", str(home / "data"))
    monkeypatch.setenv("RESIDENT_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("RESIDENT_CACHE_DIR", str(home / "cache"))
    monkeypatch.delenv("RESIDENT_API_KEY", raising=False)
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A git repository with a bug in calc.add, committed; the current directory."""
    path = Path(os.path.realpath(tmp_path / "repo"))
    path.mkdir()
    (path / "calc.py").write_text(CALC)
    (path / "test_calc.py").write_text(TEST_CALC)
    (path / "README.md").write_text("# calc\n\nAdds and multiplies.\n")
    git(path, "init", "-q")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "initial")
    monkeypatch.chdir(path)
    return path
