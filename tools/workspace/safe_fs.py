"""File operations that cannot be redirected out of a root by a symlink swapped in late.

Resolving a path and then opening it by name leaves a window: a directory on
the way can be replaced by a symlink pointing elsewhere. These helpers walk
from the root one component at a time with O_NOFOLLOW and act relative to
the directory descriptor they hold, so whatever happens to the names in the
meantime, they only ever touch entries under the root.

Reading (`open_confined_file`, `read_confined_bytes`) is the one way every
reader of workspace files opens them: the read tool, grep, the snapshot,
AGENTS.md and ignore files. The rule for symlinks: a link whose target stays
inside the root is followed (resolved link by link with readlink, then the
target is opened through the same no-follow walk); a link that leads out, by
an absolute target elsewhere or by '..' above the root, raises
OutsideLinkError, which readers report rather than read. FIFOs, devices and
sockets are refused without blocking.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tools.workspace.bounded_read import file_kind

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
TEMP_SUFFIX = ".resident-tmp"


MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS: a longer chain is a loop


class UnsafePathError(OSError):
    """A component turned out to be a symlink or not a directory while walking."""


class OutsideLinkError(UnsafePathError):
    """The path is, or passes through, a symbolic link whose target lies outside the root."""


class NotRegularFileError(OSError):
    """A FIFO, device or socket: opening it for reading could block or never end."""


def _parts(relative: PurePosixPath) -> tuple[str, ...]:
    parts = tuple(p for p in relative.parts if p not in ("", "."))
    if any(p == ".." for p in parts):
        raise UnsafePathError(errno.EINVAL, f"'..' in a confined path: {relative}")
    return parts


@contextmanager
def open_directory(root: Path, relative: PurePosixPath, *, create: bool = False) -> Iterator[int]:
    """A descriptor for root/relative, reached without following any symlink below root."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in _parts(relative):
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePathError(
                        exc.errno, f"{part!r} in {relative} is a symlink or not a directory"
                    ) from exc
                raise
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _split(relative: PurePosixPath) -> tuple[PurePosixPath, str]:
    parts = _parts(relative)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the workspace root is a directory, not a file")
    return PurePosixPath(*parts[:-1]) if len(parts) > 1 else PurePosixPath("."), parts[-1]


def open_file(root: Path, relative: PurePosixPath, flags: int = os.O_RDONLY) -> int:
    """Open root/relative without following symlinks anywhere below root.

    O_NONBLOCK keeps a FIFO from blocking the open; callers check the type.
    """
    parent, name = _split(relative)
    with open_directory(root, parent) as dir_fd:
        try:
            return os.open(
                name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(exc.errno, f"{relative} is a symbolic link") from exc
            raise


def lstat(root: Path, relative: PurePosixPath) -> os.stat_result | None:
    """lstat of root/relative, or None when it does not exist."""
    parent, name = _split(relative)
    try:
        with open_directory(root, parent) as dir_fd:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_bytes(root: Path, relative: PurePosixPath) -> tuple[bytes, os.stat_result]:
    fd = open_file(root, relative)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{relative} is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), info
    finally:
        os.close(fd)


def resolve_confined(root: Path, relative: PurePosixPath) -> PurePosixPath:
    """`relative` with every symlink under `root` resolved, still relative to `root`.

    Each component is looked at with lstat/readlink through a descriptor reached
    without following anything, so the answer is about the entries under the
    root, never about where a name elsewhere happens to point. Raises
    OutsideLinkError when a link leads out, FileNotFoundError when something
    on the way is missing, UnsafePathError for a loop or a file used as a directory.
    """
    root_names = {os.fspath(root), os.path.realpath(root)}  # an absolute target may use either
    pending = list(reversed(_parts(relative)))
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise OutsideLinkError(
                    errno.EXDEV, f"{relative} leads outside the workspace through a symbolic link"
                )
            resolved.pop()
            continue
        with open_directory(root, PurePosixPath(*resolved)) as dir_fd:
            info = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            target = os.readlink(part, dir_fd=dir_fd) if stat.S_ISLNK(info.st_mode) else None
        if target is None:
            resolved.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise UnsafePathError(errno.ELOOP, f"{relative}: too many levels of symbolic links")
        if os.path.isabs(target):
            inside = [
                PurePosixPath(target).relative_to(name)
                for name in root_names
                if PurePosixPath(target).is_relative_to(name)
            ]
            if not inside:
                raise OutsideLinkError(
                    errno.EXDEV,
                    f"{relative} is a symbolic link (or passes through one) to {target}, "
                    "outside the workspace",
                )
            resolved = []
            target_parts = inside[0].parts
        else:
            target_parts = PurePosixPath(target).parts
        pending.extend(reversed(target_parts))  # '..' in them is handled above
    return PurePosixPath(*resolved)


@dataclass
class ConfinedFile:
    """A regular file opened under a root: blocking, buffered, at its start."""

    file: BinaryIO
    info: os.stat_result
    target: PurePosixPath  # what was opened, relative to the root, with links resolved


@contextmanager
def open_confined_file(
    root: Path, relative: PurePosixPath, *, follow_links: bool = True
) -> Iterator[ConfinedFile]:
    """Open root/relative for reading without ever leaving `root`.

    The common case (no symlink on the way) is one no-follow walk. When the
    walk meets a link and `follow_links`, the path is resolved within the root
    and its target opened by the same walk; a link swapped in between fails
    the walk instead of being followed. Without `follow_links` any link is
    refused (UnsafePathError), as git does for .gitignore. Raises
    OutsideLinkError for a link leading out, IsADirectoryError for a directory,
    NotRegularFileError for a FIFO, device or socket (opened non-blocking, so
    a FIFO with no writer cannot hang the reader).
    """
    target = PurePosixPath(*_parts(relative))
    try:
        fd = open_file(root, target)
    except UnsafePathError:
        if not follow_links:
            raise
        target = resolve_confined(root, relative)
        fd = open_file(root, target)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{relative} is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(
                errno.EINVAL, f"{relative} is {file_kind(info.st_mode)}, not a regular file"
            )
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield ConfinedFile(handle, info, target)


@dataclass(frozen=True)
class ConfinedRead:
    data: bytes
    info: os.stat_result
    target: PurePosixPath
    truncated: bool  # the file holds more than the `limit` bytes in `data`


def read_confined_bytes(
    root: Path, relative: PurePosixPath, limit: int, *, follow_links: bool = True
) -> ConfinedRead:
    """At most `limit` bytes from the start of root/relative, opened as open_confined_file does."""
    with open_confined_file(root, relative, follow_links=follow_links) as opened:
        data = opened.file.read(limit)
        truncated = len(data) == limit and bool(opened.file.read(1))
        return ConfinedRead(data, opened.info, opened.target, truncated)


def atomic_write(
    root: Path,
    relative: PurePosixPath,
    data: bytes,
    *,
    mode: int | None = None,
    create_parents: bool = True,
    replace_symlink: bool = False,
) -> os.stat_result:
    """Replace root/relative with `data` in one step.

    The bytes go to a temporary file in the same directory, are flushed to
    disk, and the file is renamed over the target, so a reader sees the old
    or the new content, never a half-written file. An existing file keeps
    its permission bits (and owner, where we may set it); a new one gets the
    umask's default (or `mode`). On any failure the temporary file is removed.

    A symlink at the target is refused (it means the name changed since it was
    resolved) unless `replace_symlink`, and then the link itself is replaced;
    it is never followed.
    """
    parent, name = _split(relative)
    with open_directory(root, parent, create=create_parents) as dir_fd:
        try:
            existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISLNK(existing.st_mode) and replace_symlink:
            existing = None
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            raise IsADirectoryError(errno.EISDIR, f"{relative} exists and is not a regular file")
        if mode is None and existing is not None:
            mode = stat.S_IMODE(existing.st_mode)
        temp_name = f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        # Start private; the final mode is set before any content is written.
        fd = os.open(
            temp_name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600 if mode is not None else 0o666,
            dir_fd=dir_fd,
        )
        try:
            try:
                if mode is not None:
                    os.fchmod(fd, mode)
                if existing is not None and (existing.st_uid, existing.st_gid) != (
                    os.geteuid(),
                    os.getegid(),
                ):
                    try:
                        os.fchown(fd, existing.st_uid, existing.st_gid)
                    except PermissionError:
                        pass  # not ours to give away; the content still matters more
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temp_name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        except OSError:
            pass
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def write_symlink(root: Path, relative: PurePosixPath, target: str) -> None:
    """Create (or atomically replace) a symlink at root/relative pointing to `target`."""
    parent, name = _split(relative)
    with open_directory(root, parent, create=True) as dir_fd:
        temp_name = f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        os.symlink(target, temp_name, dir_fd=dir_fd)
        try:
            os.replace(temp_name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(temp_name, dir_fd=dir_fd)
            raise


def remove_file(root: Path, relative: PurePosixPath) -> bool:
    """Unlink a file or symlink (never following it). False if it was already gone
    or a directory on the way is now a symlink (then it is not ours to touch)."""
    parent, name = _split(relative)
    try:
        with open_directory(root, parent) as dir_fd:
            os.unlink(name, dir_fd=dir_fd)
            return True
    except (FileNotFoundError, UnsafePathError, NotADirectoryError):
        return False


def remove_empty_parents(root: Path, relative: PurePosixPath) -> None:
    """Remove the now-empty directories above a deleted file, up to (not including) root."""
    parts = list(_parts(relative))[:-1]
    while parts:
        parent = PurePosixPath(*parts[:-1]) if len(parts) > 1 else PurePosixPath(".")
        name = parts[-1]
        try:
            with open_directory(root, parent) as dir_fd:
                os.rmdir(name, dir_fd=dir_fd)
        except OSError:
            return  # not empty, gone, or not a plain directory: stop climbing
        parts.pop()
