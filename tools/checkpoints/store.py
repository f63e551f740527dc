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
from collections.abc import Iterable
from pathlib import Path

from tools.checkpoints.copies import CopyCheckpointStore
from tools.checkpoints.git_refs import GitCheckpointStore
from tools.checkpoints.protocol import DEFAULT_MAX_FILE_BYTES, CheckpointStore
from tools.git.repo import GitError, find_repository


def open_checkpoint_store(
    workspace: Path,
    data_dir: Path,
    *,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    protected: Iterable[Path] | None = None,
) -> CheckpointStore:
    """Git-backed when the workspace is in a git work tree, file copies otherwise.

    The work tree is found as the git tools find it (tools.git.repo), so a folder
    shaped like a bare repository is never taken for the workspace's repository.
    `protected`: folders neither store saves or restores (None: the user's Resident
    folders as this process places them; tools.workspace.walk)."""
    workspace = Path(os.path.realpath(workspace))
    try:
        in_git = find_repository(workspace) is not None
    except GitError:  # a broken .git file: git cannot work here, copies can
        in_git = False
    if in_git:
        return GitCheckpointStore(workspace, max_file_bytes=max_file_bytes, protected=protected)
    key = hashlib.sha256(str(workspace).encode()).hexdigest()[:16]
    return CopyCheckpointStore(
        workspace,
        Path(data_dir) / "checkpoints" / key,
        max_file_bytes=max_file_bytes,
        protected=protected,
    )
