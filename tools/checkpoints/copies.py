"""Checkpoints outside git: content-addressed copies of the workspace files.

Each checkpoint is a manifest (path -> content hash and mode, or symlink
target); file contents live once under objects/, named by their SHA-256, so
repeated checkpoints of a mostly unchanged tree cost little. A file whose
size and mtime match the previous manifest is not hashed again. Ignore
rules come from the .gitignore files in the tree, as git would apply them.
Resident's own folders (config, data, cache: the store itself among them) are
never copied when they lie inside the workspace, and a restore never touches
them, even from a checkpoint that holds them (tools.workspace.walk).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from tools.checkpoints.protocol import (
    DEFAULT_MAX_FILE_BYTES,
    Change,
    Checkpoint,
    CheckpointError,
    RestoreReport,
    new_checkpoint_id,
)
from tools.workspace import safe_fs
from tools.workspace.safe_fs import atomic_write, remove_empty_parents, remove_file, write_symlink
from tools.workspace.walk import covered, left_out, names_left_out, visible_files

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
Entries = dict[str, dict[str, Any]]


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


class CopyCheckpointStore:
    kind = "copy"

    def __init__(
        self,
        workspace: Path,
        store_dir: Path,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        protected: Iterable[Path] | None = None,
    ) -> None:
        """`protected`: folders never copied nor restored, by real path (None: the user's
        Resident folders as this process places them)."""
        self.workspace = Path(os.path.realpath(workspace))
        self.store_dir = Path(os.path.realpath(store_dir))
        self.objects = self.store_dir / "objects"
        self.manifests = self.store_dir / "manifests"
        self.max_file_bytes = max_file_bytes
        self.protected = left_out(self.workspace, protected)
        self._protected_names = names_left_out(self.workspace, self.protected)

    # -- scanning ----------------------------------------------------------

    def _inside_store(self, relative: str) -> bool:
        path = self.workspace / relative
        return path == self.store_dir or self.store_dir in path.parents

    def _object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def _scan(self, previous: tuple[Entries, float], *, keep: bool) -> tuple[Entries, list[str]]:
        """Describe every visible file now; with `keep`, also store new contents.

        A file is trusted unchanged when its size and mtime match the previous
        manifest and that mtime was well before the previous scan (as git does
        against racy timestamps: a write in the same clock tick as the scan
        could otherwise go unnoticed).
        """
        previous_entries, previous_time = previous
        trusted_before_ns = int((previous_time - 2.0) * 1e9)
        entries: Entries = {}
        skipped: list[str] = []
        for relative in visible_files(self.workspace, self.workspace, self.protected):
            if self._inside_store(relative):
                continue
            path = self.workspace / relative
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    entries[relative] = {"type": "link", "target": os.readlink(path)}
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue
                if info.st_size > self.max_file_bytes:
                    skipped.append(relative)
                    continue
                entry = {
                    "type": "file",
                    "mode": stat.S_IMODE(info.st_mode),
                    "size": info.st_size,
                    "mtime_ns": info.st_mtime_ns,
                }
                old = previous_entries.get(relative)
                if (
                    old
                    and old.get("type") == "file"
                    and (old["size"], old["mtime_ns"]) == (info.st_size, info.st_mtime_ns)
                    and info.st_mtime_ns < trusted_before_ns
                    and self._object_path(old["sha256"]).is_file()
                ):
                    entry["sha256"] = old["sha256"]
                else:
                    # No symlink followed on the way: a directory swapped for a
                    # link after the listing cannot pull outside files into the store.
                    data, _ = safe_fs.read_bytes(self.workspace, PurePosixPath(relative))
                    entry["sha256"] = hashlib.sha256(data).hexdigest()
                    entry["size"] = len(data)
                    target = self._object_path(entry["sha256"])
                    if keep and not target.exists():
                        _write_atomically(target, data)
                entries[relative] = entry
            except OSError:
                continue  # vanished or unreadable while scanning
        return entries, skipped

    # -- manifests ---------------------------------------------------------

    def _manifest_path(self, checkpoint_id: str) -> Path:
        if not _ID.match(checkpoint_id):
            raise CheckpointError(f"invalid checkpoint id {checkpoint_id!r}")
        return self.manifests / f"{checkpoint_id}.json"

    def _load(self, checkpoint_id: str) -> dict[str, Any]:
        path = self._manifest_path(checkpoint_id)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise CheckpointError(f"no checkpoint {checkpoint_id!r}") from exc

    def _latest_entries(self) -> tuple[Entries, float]:
        checkpoints = self.list()
        if not checkpoints:
            return {}, 0.0
        return self._load(checkpoints[-1].id)["entries"], checkpoints[-1].created_at

    @staticmethod
    def _checkpoint(manifest: dict[str, Any]) -> Checkpoint:
        return Checkpoint(
            manifest["id"], manifest["label"], manifest["created_at"], tuple(manifest["skipped"])
        )

    def create(self, label: str = "") -> Checkpoint:
        entries, skipped = self._scan(self._latest_entries(), keep=True)
        manifest = {
            "id": new_checkpoint_id(),
            "label": label,
            "created_at": time.time(),
            "workspace": str(self.workspace),
            "entries": entries,
            "skipped": skipped,
        }
        data = json.dumps(manifest, sort_keys=True).encode()
        _write_atomically(self._manifest_path(manifest["id"]), data)
        return self._checkpoint(manifest)

    def list(self) -> list[Checkpoint]:
        if not self.manifests.is_dir():
            return []
        checkpoints = []
        for path in sorted(self.manifests.glob("*.json")):
            try:
                checkpoints.append(self._checkpoint(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError):
                continue
        return checkpoints

    # -- comparing and restoring -------------------------------------------

    def _restorable(self, saved: Entries) -> Entries:
        """`saved` less what lies in Resident's own folders (a checkpoint taken before
        they were left out may hold them): a restore never writes there."""
        names = self._protected_names
        if not names:
            return saved
        return {path: entry for path, entry in saved.items() if not covered(path, names)}

    @staticmethod
    def _diff(current: Entries, saved: Entries) -> list[Change]:
        changes = [Change("delete", path) for path in current if path not in saved]
        for path, entry in saved.items():
            now = current.get(path)
            if now is None or any(
                now.get(key) != entry.get(key) for key in ("type", "sha256", "mode", "target")
            ):
                changes.append(Change("write", path))
        return sorted(changes, key=lambda change: change.path)

    def changes(self, checkpoint_id: str) -> list[Change]:
        saved = self._restorable(self._load(checkpoint_id)["entries"])
        current, _ = self._scan(self._latest_entries(), keep=False)
        return self._diff(current, saved)

    def restore(self, checkpoint_id: str, *, save_current: bool = True) -> RestoreReport:
        manifest = self._load(checkpoint_id)
        saved: Entries = self._restorable(manifest["entries"])
        before = self.create(f"before restoring {checkpoint_id}") if save_current else None
        if before:
            current = self._load(before.id)["entries"]
        else:
            current, _ = self._scan(self._latest_entries(), keep=False)
        changes = self._diff(current, saved)
        deleted = [c.path for c in changes if c.action == "delete"]
        written = [c.path for c in changes if c.action == "write"]
        for path in sorted(deleted, key=lambda p: p.count("/"), reverse=True):
            if remove_file(self.workspace, PurePosixPath(path)):
                remove_empty_parents(self.workspace, PurePosixPath(path))
        problems = []
        for path in written:
            entry = saved[path]
            try:
                if entry["type"] == "link":
                    write_symlink(self.workspace, PurePosixPath(path), entry["target"])
                else:
                    data = self._object_path(entry["sha256"]).read_bytes()
                    atomic_write(
                        self.workspace,
                        PurePosixPath(path),
                        data,
                        mode=entry["mode"],
                        replace_symlink=True,
                    )
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror or exc}")
        return RestoreReport(
            self._checkpoint(manifest), tuple(written), tuple(deleted), before, tuple(problems)
        )

    def delete(self, checkpoint_id: str) -> None:
        path = self._manifest_path(checkpoint_id)
        if not path.exists():
            raise CheckpointError(f"no checkpoint {checkpoint_id!r}")
        path.unlink()
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        """Remove stored contents no remaining checkpoint refers to."""
        live = set()
        for checkpoint in self.list():
            for entry in self._load(checkpoint.id)["entries"].values():
                if entry.get("sha256"):
                    live.add(entry["sha256"])
        if not self.objects.is_dir():
            return
        for bucket in self.objects.iterdir():
            for item in bucket.iterdir():
                if bucket.name + item.name not in live:
                    item.unlink(missing_ok=True)
