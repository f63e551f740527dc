"""A repository's virtual environment names the Python it was made from (`home =` in its
pyvenv.cfg). That file is the repository's: it may lead the sandbox to a real Python
installation, never to the user's home, a folder above it or a credential folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools import ToolContext, default_registry
from tools.sandbox.bubblewrap import SandboxUnavailable, detect_sandbox
from tools.sandbox.mounts import venv_base_prefixes


def python_install(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.12").mkdir(parents=True)
    (root / "lib" / "python3.12" / "os.py").write_text("")
    return root


def venv_pointing_at(workspace: Path, home: str) -> None:
    (workspace / ".venv").mkdir()
    (workspace / ".venv" / "pyvenv.cfg").write_text(f"home = {home}\nversion = 3.12.0\n")


def test_a_real_python_installation_is_shown(tmp_path):
    install = python_install(tmp_path / "pythons" / "3.12")
    workspace = tmp_path / "repo"
    workspace.mkdir()
    venv_pointing_at(workspace, str(install / "bin"))
    assert venv_base_prefixes(workspace, home=tmp_path / "home") == [install]


@pytest.mark.parametrize(
    "target",
    ["home", "home/bin", "/", "above", "home/.ssh/python", "home/.local", "no-stdlib"],
)
def test_a_hostile_home_line_shows_nothing(tmp_path, target):
    home = tmp_path / "above" / "home"
    python_install(home)  # even a home that looks like an installation stays hidden
    python_install(home / ".ssh" / "python")
    python_install(home / ".local")
    (tmp_path / "no-stdlib" / "bin").mkdir(parents=True)
    workspace = tmp_path / "repo"
    workspace.mkdir()
    venv_pointing_at(workspace, target if target == "/" else str(tmp_path / target))
    assert venv_base_prefixes(workspace, home=home) == []


def test_a_sandboxed_command_cannot_list_the_home_through_pyvenv_cfg(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "diary.txt").write_text("private\n")
    monkeypatch.setenv("HOME", str(home))
    workspace = tmp_path / "repo"
    workspace.mkdir()
    venv_pointing_at(workspace, str(home))
    sandbox = detect_sandbox(workspace)
    if isinstance(sandbox, SandboxUnavailable):
        pytest.skip(sandbox.reason)
    ctx = ToolContext(workspace=workspace, sandbox=sandbox)
    result = default_registry().call("shell", {"command": f"cat {home}/diary.txt"}, ctx)
    assert "private" not in result.output
    assert not result.ok
    # The agent's own interpreter still runs in there.
    ok = default_registry().call("shell", {"command": f"{sys.executable} -c 'print(7)'"}, ctx)
    assert ok.ok and "7" in ok.output
