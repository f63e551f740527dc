"""Checkpoints: snapshots of the workspace files that `/undo` can bring back exactly.

A snapshot covers every file that is not ignored (tracked or not); ignored
files are neither saved nor touched by a restore. Restoring rewrites the
files that differ, recreates the ones deleted since, and deletes the ones
created since. Before it changes anything, a restore takes a checkpoint of
the current state, so the restore itself can be undone.

Inside git, checkpoints are commits on private refs (`refs/resident/
checkpoints/<id>`) built through a temporary index, so the user's branch,
HEAD, index and stash never change (tools.checkpoints.git_refs). Outside git, a
content-addressed copy of the files under a data directory does the same
job behind the same interface (tools.checkpoints.copies).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

DEFAULT_MAX_FILE_BYTES = 20 * 1024 * 1024


class CheckpointError(Exception):
    pass


@dataclass(frozen=True)
class Checkpoint:
    id: str
    label: str
    created_at: float  # seconds since the epoch
    skipped: tuple[str, ...] = ()  # files left out because they were too large


@dataclass(frozen=True)
class Change:
    """What a restore would do to one path: 'write' it from the checkpoint or 'delete' it."""

    action: str
    path: str  # relative to the store's root, POSIX


@dataclass(frozen=True)
class RestoreReport:
    checkpoint: Checkpoint
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    before_restore: Checkpoint | None = None  # the state just before the restore
    problems: tuple[str, ...] = field(default=())


class CheckpointStore(Protocol):
    kind: str

    def create(self, label: str = "") -> Checkpoint: ...

    def list(self) -> list[Checkpoint]:
        """Oldest first."""
        ...

    def changes(self, checkpoint_id: str) -> list[Change]:
        """What restoring `checkpoint_id` would do, without doing it."""
        ...

    def restore(self, checkpoint_id: str, *, save_current: bool = True) -> RestoreReport: ...

    def delete(self, checkpoint_id: str) -> None: ...


def new_checkpoint_id() -> str:
    """Sortable by creation time, unique without coordination."""
    now = datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%S%f}-{secrets.token_hex(3)}"


def prune(store: CheckpointStore, keep: int) -> int:
    """Delete all but the newest `keep` checkpoints; returns how many went."""
    old = store.list()[:-keep] if keep > 0 else store.list()
    for checkpoint in old:
        store.delete(checkpoint.id)
    return len(old)


def open_checkpoint_store(
    workspace: Path, data_dir: Path, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> CheckpointStore:
    """Git-backed when the workspace is in a git work tree, file copies otherwise.

    The work tree is found as the git tools find it (tools.git.repo), so a folder
    shaped like a bare repository is never taken for the workspace's repository."""
    from tools.checkpoints.copies import CopyCheckpointStore
    from tools.checkpoints.git_refs import GitCheckpointStore
    from tools.git.repo import GitError, find_repository

    workspace = Path(os.path.realpath(workspace))
    try:
        in_git = find_repository(workspace) is not None
    except GitError:  # a broken .git file: git cannot work here, copies can
        in_git = False
    if in_git:
        return GitCheckpointStore(workspace, max_file_bytes=max_file_bytes)
    key = hashlib.sha256(str(workspace).encode()).hexdigest()[:16]
    return CopyCheckpointStore(
        workspace, Path(data_dir) / "checkpoints" / key, max_file_bytes=max_file_bytes
    )
