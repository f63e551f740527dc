"""What a checkpoint store is, whatever keeps the files: its protocol and the values it returns.

Both stores (tools.checkpoints.git_refs, tools.checkpoints.copies) implement
`CheckpointStore`; tools.checkpoints.store picks one for a workspace.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
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
