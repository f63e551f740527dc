"""The files of the KV disk tier as a folder: written atomically, accounted whole,
recovered after a crash.

A page, scale set or meta file is written to `.<name>.<pid>.tmp` beside its
final name and renamed into place, so a reader never sees half a file. What a
process can leave behind when it dies is therefore only temporaries:

- a process killed mid-write (SIGKILL, power loss, the OOM killer) leaves a
  partial `.tmp` that nothing else will ever rename or remove;
- a write that fails (ENOSPC, EFBIG, EIO) removes its own temporary at once,
  so a full disk is not kept full by the write that found it full.

`remove_stale_temporaries` runs when a tier opens and before every eviction: a
temporary whose writer is gone (its PID is not alive) or that has not been
written to for `STALE_AFTER_S` (the PID was reused, or it lives in another PID
namespace) is removed, and an open reports what it removed. A page is a few
MiB at most and is written in one go, so a live writer never leaves its
temporary untouched for minutes.

The budget counts every byte under the root: pages, temporaries (a live
writer's too), scale sets, meta files and anything else found there. Only
page files and stale temporaries are ever removed to meet it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".kvp"
# `.<final name>.<pid>.tmp`: the writer's PID says whether a writer may still own it.
_TEMP = re.compile(r"^\..+\.(\d+)\.tmp$")
STALE_AFTER_S = 600.0


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` by a temporary and a rename; a failed write removes its
    temporary before the error goes on (a full disk must not stay full of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0  # someone else's live process (or a name that is no PID: age decides)
    return True


def is_stale_temporary(name: str, mtime: float, now: float | None = None) -> bool:
    """A temporary whose writer is gone, or that no one has written to for a while."""
    match = _TEMP.match(name)
    if match is None:
        return False
    now = time.time() if now is None else now
    return not _pid_alive(int(match.group(1))) or now - mtime > STALE_AFTER_S


@dataclass
class FileEntry:
    path: Path
    size: int
    mtime_ns: int


def all_files(root: Path) -> list[FileEntry]:
    """Every regular file under `root` (links are not followed, and not counted)."""
    out = []
    for folder, _, names in os.walk(root) if root.is_dir() else []:
        for name in names:
            path = Path(folder) / name
            try:
                st = path.lstat()
            except OSError:
                continue  # removed meanwhile by another process
            if stat.S_ISREG(st.st_mode):
                out.append(FileEntry(path, st.st_size, st.st_mtime_ns))
    return out


def remove_stale_temporaries(root: Path, files: list[FileEntry] | None = None) -> tuple[int, int]:
    """Remove the temporaries no live writer owns; (files removed, bytes freed)."""
    now, count, freed = time.time(), 0, 0
    for entry in all_files(root) if files is None else files:
        if is_stale_temporary(entry.path.name, entry.mtime_ns / 1e9, now):
            try:
                entry.path.unlink()
            except FileNotFoundError:
                continue  # another process removed it first
            except OSError:
                continue  # a read-only cache: nothing to be done here
            count, freed = count + 1, freed + entry.size
    return count, freed


def page_depth(path: Path) -> int | None:
    """The depth a page file's name gives (`<depth>-<key>.kvp`); None for other files."""
    if not path.name.endswith(SUFFIX) or path.parent.name != "pages":
        return None
    try:
        return int(path.name.split("-", 1)[0])
    except ValueError:
        return None


def evict(root: Path, budget_bytes: int) -> int:
    """Delete stale temporaries, then least recently used pages (oldest first and,
    among equals, deepest first, so a prefix loses its tail before its head) until
    every file under `root` fits the budget; returns the pages deleted."""
    files = all_files(root)
    remove_stale_temporaries(root, files)
    files = [e for e in files if e.path.exists()]
    total = sum(e.size for e in files)
    pages = sorted(
        (e.mtime_ns, -depth, e.size, e.path)
        for e in files
        if (depth := page_depth(e.path)) is not None
    )
    removed = 0
    for _, _, size, path in pages:
        if total <= budget_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed += 1
    return removed


def summary(root: Path) -> list[dict]:
    """One entry per engine fingerprint: what it is, its pages, every byte its folder
    holds (what the budget counts) and last use."""
    out = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir():
            continue
        files = all_files(folder)
        pages = [e for e in files if page_depth(e.path) is not None]
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        out.append(
            {
                "engine": folder.name,
                "model": meta.get("model", "?"),
                "kv_cache_dtype": meta.get("kv_cache_dtype", "?"),
                "page_size": meta.get("page_size"),
                "pages": len(pages),
                "bytes": sum(e.size for e in files),
                "last_used": max((e.mtime_ns for e in pages), default=0) / 1e9,
            }
        )
    return out


def clear(root: Path) -> int:
    """Delete every saved page, scale set and temporary; returns the bytes freed."""
    freed = sum(e.size for e in all_files(root))
    if root.is_dir():
        shutil.rmtree(root)
    return freed
