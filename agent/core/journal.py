"""JSON-lines files the agent appends to: read without trusting the last bytes,
repaired before the next append.

A session's `messages.jsonl` and `events.jsonl` (todo lists included: they are
events) and the TUI's prompt history grow one record per line. A process
killed mid-append (SIGKILL, power loss, a full disk) can leave a last line
without its newline, cut anywhere, even inside a UTF-8 character. Two rules
keep that from costing more than the torn line itself:

- reading splits the bytes on b"\\n" and decodes each line inside the error
  handling, so a torn or undecodable line is left out and never stops a
  `--continue` (UTF-8 never uses the byte 0x0A inside a character, so one bad
  line cannot spill into the next);
- before appending, the file is cut back to its last whole line, so the next
  record starts a line of its own; appended to the torn bytes it would form
  one unreadable line with them, and the new turn would be lost too.

A last line that lacks only its newline (it parses whole) is kept and given
one: it is a complete record, and reading counts it as such. Each file's
damage is reported once per process, as one warning.

Checkpoints are not journals: each is a whole file written by a temporary and
a rename (tools/checkpoints), so a kill leaves the previous state.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)
_BAD = object()
_CHUNK = 1 << 16
_warned: set[tuple[str, str]] = set()


def _parse(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _BAD


def _warn_once(path: Path, kind: str, message: str, *args: Any) -> None:
    key = (str(path), kind)
    if key not in _warned:
        _warned.add(key)
        log.warning(message, path, *args)


def _warn_torn(path: Path, size: int) -> None:
    _warn_once(
        path,
        "torn",
        "%s ends in a line torn by an interrupted write (%d bytes); it is left out, "
        "and cut off before the next append",
        size,
    )


def read_records(path: Path) -> list[Any]:
    """The JSON value of every readable line; [] when the file does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with its newline
    records, bad = [], 0
    for line in lines:
        if line.strip():
            value = _parse(line)
            if value is _BAD:
                bad += 1
            else:
                records.append(value)
    if tail.strip():
        value = _parse(tail)
        if value is _BAD:
            _warn_torn(path, len(tail))
        else:
            records.append(value)
    if bad:
        _warn_once(path, "bad", "%s has %d unreadable line(s); they are left out", bad)
    return records


def _last_line_start(handle: IO[bytes], size: int) -> int:
    """The offset just past the last b"\\n" before `size` (0 when there is none)."""
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        handle.seek(start)
        found = handle.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def repair_tail(path: Path) -> int:
    """Cut a torn last line off the file (a whole record missing only its newline
    gets the newline instead); returns the bytes cut."""
    try:
        handle = path.open("rb+")
    except FileNotFoundError:
        return 0
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        start = _last_line_start(handle, size)
        handle.seek(start)
        if _parse(handle.read(size - start)) is not _BAD:
            handle.seek(size)
            handle.write(b"\n")
            return 0
        handle.truncate(start)
        handle.flush()
        os.fsync(handle.fileno())
    _warn_torn(path, size - start)
    return size - start


def open_for_append(path: Path) -> IO[str]:
    """`path` opened to append text lines, its torn tail cut off first."""
    repair_tail(path)
    return path.open("a", encoding="utf-8")
