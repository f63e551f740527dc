"""Reading a file someone else shaped: regular files only, never more than a cap.

A repository ships files Resident reads on its own (`.resident/hooks.json`,
`.resident/mcp.json`, custom commands, a `.git` file, `pyvenv.cfg`), and the
user's config folder holds more (hooks.json, mcp.json, the trust records). A
plain `Path.read_bytes()` on any of them trusts its shape: a link to
/dev/zero reads forever, a FIFO blocks the open until someone writes, a
sparse file of a terabyte fills memory. Every such read goes through
`read_bounded` instead:

- the path is followed through symbolic links, and what it leads to must be
  a regular file; a directory, FIFO, socket or device is refused before it
  is opened (opening some devices does something), and again by `fstat` on
  what was opened (the name may have changed in between), which is opened
  non-blocking and without becoming a controlling terminal;
- at most `max_bytes` are read. Over that, the file is refused (FileTooLarge)
  or, with `truncate=True`, its first `max_bytes` are returned (for readers
  that want only a head: a `#!` line, a `gitdir:` line);
- the errors are OSErrors whose text says what the file is and why it was
  not read, so callers that already report "cannot read it: ..." stay clear.

A missing file raises FileNotFoundError as `open` does. Reads confined to
the workspace (the read tool, the snapshot, AGENTS.md, ignore files) use
safe_fs.open_confined_file, which applies the same rule to what it opens
and describes refused files with `file_kind` from here.
"""

from __future__ import annotations

import os
import stat

# JSON settings (hooks.json, mcp.json, trust records): far above any real one,
# far below what would hurt to parse.
MAX_CONFIG_BYTES = 1024 * 1024
_READ_CHUNK = 1 << 16
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class RefusedFile(OSError):
    """A file that was not read (whole) because of its kind or size. `reason` is the
    rest of a sentence about the file ("is a FIFO (named pipe), not a regular file")."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{os.fspath(path)} {reason}")
        self.path = os.fspath(path)
        self.reason = reason


class NotARegularFile(RefusedFile):
    """A directory, FIFO, socket or device (reading it could block or never end)."""


class FileTooLarge(RefusedFile):
    """More bytes than the reader's cap."""


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, for a sentence: 'a FIFO (named pipe)'."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _refuse_kind(path: str, mode: int) -> NotARegularFile:
    kind = file_kind(mode)
    reason = f"is {kind}, not a regular file" if kind.startswith("a ") else "is not a regular file"
    if os.path.islink(path):
        reason += f" (it is a symbolic link to {os.path.realpath(path)})"
    return NotARegularFile(path, reason)


def _too_large(path: str, size: int | None, max_bytes: int) -> FileTooLarge:
    if size is None:  # it grew after fstat
        return FileTooLarge(path, f"holds more than {max_bytes:,} bytes, the most it may have")
    return FileTooLarge(path, f"is {size:,} bytes; it may have at most {max_bytes:,}")


def read_bounded(path: str | os.PathLike[str], max_bytes: int, *, truncate: bool = False) -> bytes:
    """The bytes of the regular file `path` leads to, at most `max_bytes` of them.

    Raises FileNotFoundError (no such file), NotARegularFile, FileTooLarge (over
    `max_bytes`, unless `truncate`: then the first `max_bytes` come back), or the
    OSError of the failed open or read.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must not be negative, not {max_bytes}")
    name = os.fspath(path)
    # A look before opening: opening a device can act (rewind a tape, hang up a line).
    before = os.stat(name)
    if not stat.S_ISREG(before.st_mode):
        raise _refuse_kind(name, before.st_mode)
    fd = os.open(name, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)  # what was opened, whatever the name leads to by now
        if not stat.S_ISREG(info.st_mode):
            raise _refuse_kind(name, info.st_mode)
        if info.st_size > max_bytes and not truncate:
            raise _too_large(name, info.st_size, max_bytes)
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        wanted = max_bytes + 1  # one more than allowed tells a file that grew
        while wanted > 0 and (chunk := os.read(fd, min(wanted, _READ_CHUNK))):
            chunks.append(chunk)
            wanted -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        if not truncate:
            raise _too_large(name, None, max_bytes)
        data = data[:max_bytes]
    return data


def read_bounded_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """The file as UTF-8 text (a leading byte order mark dropped), read as read_bounded
    reads it. Raises what read_bounded raises, and UnicodeDecodeError."""
    return read_bounded(path, max_bytes).decode("utf-8-sig")
