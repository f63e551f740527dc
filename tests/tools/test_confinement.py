"""Every path is resolved through symlinks and must stay in the workspace, even under a late swap."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

import pytest

import tools.files.edit
import tools.files.guard
import tools.files.write
from tools.files.guard import resolve_for_write
from tools.workspace.paths import OutsideWorkspaceError, PathError, resolve_path, sensitivity
from tools.workspace.safe_fs import UnsafePathError, atomic_write


def test_relative_paths_resolve_inside(workspace):
    (workspace / "src").mkdir()
    resolved = resolve_path("src/../src/a.py", [workspace])
    assert resolved.real == workspace / "src" / "a.py"
    assert resolved.display == "src/a.py"


@pytest.mark.parametrize("raw", ["../outside/secret.txt", "src/../../outside/secret.txt", ".."])
def test_dotdot_escapes_are_refused(workspace, outside, raw):
    with pytest.raises(OutsideWorkspaceError):
        resolve_path(raw, [workspace])


def test_absolute_and_home_paths_outside_are_refused(workspace, outside):
    with pytest.raises(OutsideWorkspaceError):
        resolve_path(str(outside / "secret.txt"), [workspace])
    with pytest.raises(OutsideWorkspaceError):
        resolve_path("/etc/passwd", [workspace])
    with pytest.raises(OutsideWorkspaceError):
        resolve_path("~/.ssh/id_rsa", [workspace])


def test_absolute_path_inside_is_fine(workspace):
    assert resolve_path(str(workspace / "a"), [workspace]).display == "a"


@pytest.mark.parametrize("raw", ["", "   ", "a\x00b"])
def test_malformed_paths_are_refused(workspace, raw):
    with pytest.raises(PathError):
        resolve_path(raw, [workspace])


def test_file_symlink_pointing_out_is_refused(workspace, outside):
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(OutsideWorkspaceError, match="symbolic link"):
        resolve_path("link.txt", [workspace])


def test_directory_symlink_pointing_out_is_refused(workspace, outside):
    (workspace / "linkdir").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutsideWorkspaceError):
        resolve_path("linkdir/secret.txt", [workspace])
    with pytest.raises(OutsideWorkspaceError):
        resolve_path("linkdir/new-file.txt", [workspace])


def test_symlink_inside_the_workspace_resolves_to_its_target(workspace):
    (workspace / "real.txt").write_text("x")
    (workspace / "alias.txt").symlink_to("real.txt")
    assert resolve_path("alias.txt", [workspace]).real == workspace / "real.txt"


def test_extra_roots_are_allowed(workspace, outside):
    resolved = resolve_path(str(outside / "secret.txt"), [workspace, outside])
    assert resolved.root == outside
    assert not resolved.in_workspace


def test_sensitivity_flags_git_internals_and_secrets(workspace):
    assert sensitivity(resolve_path(".git/config", [workspace]))
    assert sensitivity(resolve_path("app/.env", [workspace]))
    assert sensitivity(resolve_path(".env.production", [workspace]))
    assert sensitivity(resolve_path("keys/id_ed25519", [workspace]))
    assert sensitivity(resolve_path("home/.ssh/config", [workspace]))
    assert sensitivity(resolve_path(".env.example", [workspace])) is None
    assert sensitivity(resolve_path("src/main.py", [workspace])) is None


def test_tools_refuse_escapes_and_leak_nothing(call, workspace, outside):
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    (workspace / "linkdir").symlink_to(outside, target_is_directory=True)
    attempts = [
        ("read", {"path": "../outside/secret.txt"}),
        ("read", {"path": str(outside / "secret.txt")}),
        ("read", {"path": "link.txt"}),
        ("read", {"path": "linkdir/secret.txt"}),
        ("list", {"path": "linkdir"}),
        ("glob", {"pattern": "*", "path": "../outside"}),
        ("grep", {"pattern": "SECRET", "path": "linkdir"}),
        ("write", {"path": "linkdir/new.txt", "content": "x"}),
        ("write", {"path": "../outside/new.txt", "content": "x"}),
        ("edit", {"path": "link.txt", "old_string": "TOP", "new_string": "NOT"}),
        ("shell", {"command": "pwd", "workdir": "linkdir"}),
    ]
    for name, arguments in attempts:
        result = call(name, **arguments)
        assert not result.ok, (name, arguments)
        assert "outside the workspace" in result.output
        assert "TOP SECRET" not in result.output
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


def test_grep_does_not_follow_symlinked_files_out(call, workspace, outside):
    (workspace / "link.txt").symlink_to(outside / "secret.txt")
    (workspace / "plain.txt").write_text("nothing here\n")
    for use_rg in (False, True):
        if use_rg and not shutil.which("rg"):
            continue
        result = call("grep", pattern="SECRET")
        assert "TOP SECRET" not in result.output


def _swap_directory_after_resolving(monkeypatch, module, directory: Path, target: Path):
    """Resolve as usual, then replace `directory` with a symlink to `target` (the race)."""
    real = resolve_for_write

    def resolve_then_swap(raw, ctx):
        resolved = real(raw, ctx)
        shutil.rmtree(directory)
        directory.symlink_to(target, target_is_directory=True)
        return resolved

    # write and edit both resolve through file_guard.modify_locked; `module` names the
    # tool under test.
    assert module in (tools.files.write, tools.files.edit)
    monkeypatch.setattr(tools.files.guard, "resolve_for_write", resolve_then_swap)


def test_write_after_a_late_symlink_swap_stays_inside(call, workspace, outside, monkeypatch):
    (workspace / "sub").mkdir()
    _swap_directory_after_resolving(monkeypatch, tools.files.write, workspace / "sub", outside)
    result = call("write", path="sub/new.txt", content="escaped?")
    assert not result.ok
    assert "symbolic link" in result.output
    assert not (outside / "new.txt").exists()


def test_edit_after_a_late_symlink_swap_stays_inside(call, workspace, outside, monkeypatch):
    (workspace / "sub").mkdir()
    (workspace / "sub" / "secret.txt").write_text("TOP SECRET\n")
    assert call("read", path="sub/secret.txt").ok
    _swap_directory_after_resolving(monkeypatch, tools.files.edit, workspace / "sub", outside)
    result = call("edit", path="sub/secret.txt", old_string="TOP", new_string="NOT")
    assert not result.ok
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


def test_atomic_write_refuses_a_symlinked_directory_component(workspace, outside):
    (workspace / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        atomic_write(workspace, PurePosixPath("sub/new.txt"), b"x")
    assert not (outside / "new.txt").exists()


def test_atomic_write_never_follows_a_final_symlink(workspace, outside):
    # The file itself became a symlink after the check: refused, or replaced when asked.
    (workspace / "file.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(IsADirectoryError):
        atomic_write(workspace, PurePosixPath("file.txt"), b"new\n")
    assert os.path.islink(workspace / "file.txt")
    atomic_write(workspace, PurePosixPath("file.txt"), b"new\n", replace_symlink=True)
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
    assert not os.path.islink(workspace / "file.txt")
    assert (workspace / "file.txt").read_text() == "new\n"


def test_file_tools_never_write_git_internals(call, workspace):
    (workspace / ".git" / "hooks").mkdir(parents=True)
    result = call("write", path=".git/hooks/pre-commit", content="#!/bin/sh\nrm -rf ~\n")
    assert not result.ok and ".git" in result.output
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists()
