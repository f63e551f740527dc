"""Checkpoints: restore brings files back exactly and leaves the user's git state alone."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.tools.conftest import commit_all, git, init_repo
from tools import CheckpointError, open_checkpoint_store
from tools.checkpoints.copies import CopyCheckpointStore
from tools.checkpoints.git_refs import GitCheckpointStore
from tools.checkpoints.protocol import prune


def _tree(root: Path) -> dict[str, object]:
    """Every file under root (outside .git): content, exec bit, or symlink target."""
    found: dict[str, object] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[relative] = ("link", os.readlink(path))
            else:
                executable = bool(path.stat().st_mode & stat.S_IXUSR)
                found[relative] = (path.read_bytes(), executable)
    return found


def _populate(root: Path) -> None:
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('v1')\n")
    (root / "src" / "gone.py").write_text("to be deleted\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "dos.txt").write_bytes(b"a\r\nb\r\n")
    (root / "link").symlink_to("src/app.py")
    (root / "debug.log").write_text("ignored v1\n")


def _mutate(root: Path) -> None:
    (root / "src" / "app.py").write_text("print('v2')\n")  # modified
    (root / "src" / "gone.py").unlink()  # deleted
    (root / "run.sh").chmod(0o644)  # mode change
    (root / "dos.txt").write_bytes(b"a\nb\n")  # line endings changed
    (root / "link").unlink()
    (root / "link").symlink_to("run.sh")  # symlink retargeted
    (root / "new_dir" / "deep").mkdir(parents=True)
    (root / "new_dir" / "deep" / "new.py").write_text("created later\n")  # untracked, new
    (root / "debug.log").write_text("ignored v2\n")  # ignored: must survive as is
    (root / "build").mkdir()
    (root / "build" / "out.bin").write_bytes(b"\x00artifact")  # ignored, new


def _check_restore(store, root: Path) -> None:
    _populate(root)
    if isinstance(store, GitCheckpointStore):
        git(root, "add", "src/app.py")  # a staged file, too
    snapshot = _tree(root)
    checkpoint = store.create("before the agent's edits")
    _mutate(root)
    mutated = _tree(root)
    preview = {(c.action, c.path) for c in store.changes(checkpoint.id)}
    assert ("delete", "new_dir/deep/new.py") in preview
    assert ("write", "src/gone.py") in preview and ("write", "src/app.py") in preview
    assert not any("debug.log" in path or "build/" in path for _, path in preview)

    report = store.restore(checkpoint.id)
    restored = _tree(root)
    expected = dict(snapshot)
    expected["debug.log"] = mutated["debug.log"]  # ignored files are left alone
    expected["build/out.bin"] = mutated["build/out.bin"]
    assert restored == expected
    assert not (root / "new_dir").exists()  # emptied directories go too
    assert "new_dir/deep/new.py" in report.deleted and "src/gone.py" in report.written
    assert not report.problems

    # The restore is itself undoable.
    assert report.before_restore is not None
    store.restore(report.before_restore.id)
    assert _tree(root) == mutated


def test_git_checkpoint_restore_leaves_head_index_stash_and_branch_alone(workspace):
    init_repo(workspace)
    (workspace / "stashed.txt").write_text("base\n")
    commit_all(workspace, "base")
    (workspace / "stashed.txt").write_text("stash me\n")
    git(workspace, "stash", "-q")
    git_dir = workspace / ".git"

    def user_state():
        return (
            git(workspace, "rev-parse", "HEAD", "refs/heads/main", "refs/stash"),
            git(workspace, "symbolic-ref", "HEAD"),
            [
                line
                for line in git(
                    workspace, "for-each-ref", "--format=%(refname) %(objectname)"
                ).splitlines()
                if not line.startswith("refs/resident/")
            ],
            git(workspace, "reflog", "show", "--all", "--format=%H %gs"),
        )

    store = open_checkpoint_store(workspace, workspace / "unused-data-dir")
    assert store.kind == "git"
    _populate(workspace)
    git(workspace, "add", "src/app.py")
    index_before = (git_dir / "index").read_bytes()
    state_before = user_state()
    checkpoint = store.create()
    assert (git_dir / "index").read_bytes() == index_before
    assert user_state() == state_before
    assert git(workspace, "rev-parse", f"refs/resident/checkpoints/{checkpoint.id}").strip()
    _mutate(workspace)
    index_mutated = (git_dir / "index").read_bytes()
    store.restore(checkpoint.id)
    assert (git_dir / "index").read_bytes() == index_mutated
    assert user_state() == state_before
    assert git(workspace, "stash", "list").count("\n") == 1


def test_git_restore_brings_files_back_exactly(workspace):
    init_repo(workspace)
    (workspace / "README").write_text("hi\n")
    commit_all(workspace)
    _check_restore(GitCheckpointStore(workspace), workspace)


def test_git_checkpoints_work_without_commits(workspace):
    init_repo(workspace)
    _check_restore(GitCheckpointStore(workspace), workspace)
    unborn = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=workspace)
    assert unborn.returncode != 0  # still no commit on the user's branch


def test_copy_checkpoints_outside_git(workspace, tmp_path):
    store = open_checkpoint_store(workspace, tmp_path / "data")
    assert store.kind == "copy"
    _check_restore(store, workspace)


def test_copy_store_inside_the_workspace_is_not_snapshotted(workspace):
    store = CopyCheckpointStore(workspace, workspace / ".resident")
    (workspace / "a.txt").write_text("a\n")
    checkpoint = store.create()
    (workspace / "a.txt").write_text("b\n")
    store.restore(checkpoint.id)
    assert (workspace / "a.txt").read_text() == "a\n"
    assert (workspace / ".resident" / "manifests").is_dir()  # not deleted by the restore


@pytest.mark.parametrize("kind", ["git", "copy"])
def test_listing_deleting_and_pruning(workspace, tmp_path, kind):
    if kind == "git":
        init_repo(workspace)
    store = open_checkpoint_store(workspace, tmp_path / "data")
    (workspace / "f.txt").write_text("1")
    first = store.create("one")
    (workspace / "f.txt").write_text("2")
    second = store.create("two")
    assert [c.id for c in store.list()] == [first.id, second.id]
    assert [c.label for c in store.list()] == ["one", "two"]
    store.delete(first.id)
    assert [c.id for c in store.list()] == [second.id]
    with pytest.raises(CheckpointError):
        store.restore(first.id)
    with pytest.raises(CheckpointError):
        store.restore("../../etc/passwd")
    store.create("three")
    assert prune(store, keep=1) == 1
    assert [c.label for c in store.list()] == ["three"]


@pytest.mark.parametrize("kind", ["git", "copy"])
def test_large_untracked_files_are_skipped_and_kept(workspace, tmp_path, kind):
    if kind == "git":
        init_repo(workspace)
        store = GitCheckpointStore(workspace, max_file_bytes=1000)
    else:
        store = CopyCheckpointStore(workspace, tmp_path / "data", max_file_bytes=1000)
    (workspace / "small.txt").write_text("small\n")
    checkpoint = store.create()
    (workspace / "dataset.bin").write_bytes(b"x" * 5000)
    skipping = store.create()
    assert skipping.skipped == ("dataset.bin",)
    store.restore(checkpoint.id)
    assert (workspace / "dataset.bin").stat().st_size == 5000  # not ours to delete


def test_git_workspace_in_a_subdirectory_only_touches_that_subdirectory(tmp_path):
    repo = init_repo(tmp_path / "repo")
    (repo / "outside_ws.txt").write_text("v1\n")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "mod.py").write_text("v1\n")
    commit_all(repo)
    store = open_checkpoint_store(repo / "pkg", tmp_path / "data")
    checkpoint = store.create()
    (repo / "outside_ws.txt").write_text("v2\n")
    (repo / "pkg" / "mod.py").write_text("v2\n")
    (repo / "pkg" / "extra.py").write_text("new\n")
    store.restore(checkpoint.id)
    assert (repo / "pkg" / "mod.py").read_text() == "v1\n"
    assert not (repo / "pkg" / "extra.py").exists()
    assert (repo / "outside_ws.txt").read_text() == "v2\n"


def test_restore_does_not_follow_a_symlinked_directory_out(workspace, outside):
    init_repo(workspace)
    store = GitCheckpointStore(workspace)
    checkpoint = store.create()
    (workspace / "escape").symlink_to(outside, target_is_directory=True)
    store.restore(checkpoint.id)
    assert not (workspace / "escape").exists()
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


def test_git_snapshot_sees_an_edit_made_within_one_clock_tick(workspace):
    """Linux stamps files with a coarse clock, so an edit of the same size made
    within one tick of `git add` leaves mtime, size and inode unchanged. Git
    notices such "racily clean" entries only by comparing them with the index
    file's own mtime, so the copy of the index a snapshot starts from must keep
    that mtime. The tick is simulated here with utime (ctime cannot be set, so
    the test repository does not trust it)."""
    init_repo(workspace)
    git(workspace, "config", "core.trustctime", "false")
    app = workspace / "app.py"
    app.write_text("print('v1')\n")
    tick = app.stat().st_mtime_ns - 10**10  # well before the snapshot's own writes
    os.utime(app, ns=(tick, tick))
    git(workspace, "add", "app.py")
    os.utime(workspace / ".git" / "index", ns=(tick, tick))
    store = GitCheckpointStore(workspace)
    checkpoint = store.create()
    app.write_text("print('v2')\n")  # same size, same inode
    os.utime(app, ns=(tick, tick))
    assert [(c.action, c.path) for c in store.changes(checkpoint.id)] == [("write", "app.py")]
    store.restore(checkpoint.id)
    assert app.read_text() == "print('v1')\n"


@pytest.mark.parametrize("kind", ["git", "copy"])
def test_residents_folders_are_never_saved_nor_restored(workspace, tmp_path, kind):
    """Resident in $HOME: a checkpoint leaves the config folder out, and `/undo` to one
    taken before it was left out (which holds the folder) neither writes nor deletes
    there: what the person changed in the meantime stays."""
    config = workspace / ".config" / "resident"
    config.mkdir(parents=True)
    (config / "hooks.json").write_text('{"hooks": {}}\n')
    (workspace / "a.txt").write_text("a1\n")
    if kind == "git":
        init_repo(workspace)

    def store(protected):
        if kind == "git":
            return GitCheckpointStore(workspace, protected=protected)
        return CopyCheckpointStore(workspace, tmp_path / "data", protected=protected)

    old = store(()).create("holds the config folder")
    guarded = store([config])
    (config / "hooks.json").write_text('{"hooks": {"session_start": []}}\n')  # the person's
    (config / "trusted-hooks.json").write_text("{}\n")
    (workspace / "a.txt").write_text("a2\n")
    assert [(c.action, c.path) for c in guarded.changes(old.id)] == [("write", "a.txt")]
    report = guarded.restore(old.id)
    assert report.written == ("a.txt",) and report.deleted == ()
    assert (workspace / "a.txt").read_text() == "a1\n"
    assert (config / "hooks.json").read_text() == '{"hooks": {"session_start": []}}\n'
    assert (config / "trusted-hooks.json").exists()
    assert report.before_restore is not None
    (workspace / "a.txt").write_text("a3\n")
    guarded.restore(report.before_restore.id)  # the checkpoint the restore took: no config in it
    assert (workspace / "a.txt").read_text() == "a2\n"
    if kind == "git":
        ref = f"refs/resident/checkpoints/{report.before_restore.id}"
        saved = git(workspace, "ls-tree", "-r", "--name-only", ref).split()
    else:
        manifest = tmp_path / "data" / "manifests" / f"{report.before_restore.id}.json"
        saved = list(json.loads(manifest.read_text())["entries"])
    assert "a.txt" in saved and not [p for p in saved if p.startswith(".config")]
