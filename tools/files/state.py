"""Remember what the agent last saw of each file, so it never overwrites changes it has not seen.

A read records a stamp (size, mtime, content hash). A write or edit of an
existing file is allowed only when the file still matches its stamp. The
hash is the judge: a file touched without a change still counts as seen,
and a same-size rewrite within the mtime granularity still counts as changed.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileStamp:
    size: int
    mtime_ns: int
    sha256: str

    @classmethod
    def of_bytes(cls, data: bytes, stat: os.stat_result) -> FileStamp:
        return cls(
            size=len(data), mtime_ns=stat.st_mtime_ns, sha256=hashlib.sha256(data).hexdigest()
        )

    @classmethod
    def of_fd(cls, fd: int) -> FileStamp:
        """Hash an open file without loading it whole (reads from the start)."""
        stat = os.fstat(fd)
        digest = hashlib.sha256()
        offset = 0
        while chunk := os.pread(fd, 1 << 20, offset):
            digest.update(chunk)
            offset += len(chunk)
        return cls(size=offset, mtime_ns=stat.st_mtime_ns, sha256=digest.hexdigest())

    def same_content(self, other: FileStamp) -> bool:
        return self.size == other.size and self.sha256 == other.sha256


class FileStateLedger:
    """Stamps keyed by real path, plus a lock per path to serialize writers.

    The per-path lock makes "check the stamp, then replace the file" one step
    for concurrent tool calls in this process, so two racing edits are
    applied one after the other instead of one silently undoing the other.
    """

    def __init__(self) -> None:
        self._stamps: dict[Path, FileStamp] = {}
        self._locks: dict[Path, threading.Lock] = {}
        self._guard = threading.Lock()

    def record(self, path: Path, stamp: FileStamp) -> None:
        with self._guard:
            self._stamps[path] = stamp

    def get(self, path: Path) -> FileStamp | None:
        with self._guard:
            return self._stamps.get(path)

    def forget(self, path: Path) -> None:
        with self._guard:
            self._stamps.pop(path, None)

    def clear(self) -> None:
        """Forget everything, e.g. after a checkpoint restore rewrote files."""
        with self._guard:
            self._stamps.clear()

    @contextmanager
    def locked(self, path: Path) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(path, threading.Lock())
        with lock:
            yield
