"""Text files read and written through the user's editor, when one drives the agent.

An editor driving the agent (over ACP) may hold unsaved changes: the agent
should read what the user sees, and its edits should land in the editor,
which then shows and records them. `FileAccess` (tools/context.py) is that channel. The front end
supplies it in `ToolContext.file_access` (tools never import the front end);
without one, or when it declines, the tools read and write the disk as
always.

What does not change: paths are resolved and confined before the editor is
asked, so the editor only ever sees real paths inside the workspace; the
stale-file check compares against what the editor returned at the last read;
checkpoints still snapshot the disk before the first change. Only files that
are valid UTF-8 on disk go through the editor: its API speaks text, and the
edit tool's promise to keep undecodable bytes untouched holds on the disk
path alone.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import BinaryIO

from tools.context import ToolContext
from tools.files.state import FileStamp
from tools.workspace.paths import ResolvedPath
from tools.workspace.safe_fs import atomic_write, lstat, open_directory


def editor_bytes(ctx: ToolContext, path: Path, disk: bytes) -> bytes | None:
    """The editor's text of `path` as UTF-8 bytes, or None: no editor, it declined,
    or the file on disk is not UTF-8 (then the disk's bytes are what counts)."""
    if ctx.file_access is None:
        return None
    try:
        disk.decode("utf-8")
    except UnicodeDecodeError:
        return None
    text = ctx.file_access.read_text(path)
    if text is None:
        return None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a broken client
        return None


def current_bytes(ctx: ToolContext, path: Path, disk: bytes) -> bytes:
    """What a file holds for the agent: the editor's text when there is one, else `disk`."""
    shown = editor_bytes(ctx, path, disk)
    return disk if shown is None else shown


def editor_view(ctx: ToolContext, path: Path, handle: BinaryIO, size: int) -> BinaryIO | None:
    """The editor's text of an open file as a stream for the read tool, or None to
    stream the disk. Files over the edit size limit are read from disk: they cannot
    be edited anyway, and the editor would have to send them whole."""
    if ctx.file_access is None or size > ctx.limits.edit_max_file_bytes:
        return None
    disk = handle.read()
    handle.seek(0)
    shown = editor_bytes(ctx, path, disk)
    return None if shown is None else io.BytesIO(shown)


def write_file(ctx: ToolContext, target: ResolvedPath, payload: bytes) -> FileStamp:
    """Write `payload` to `target` (through the editor when there is one and it is
    text, else atomically on disk); the stamp of what was written."""
    if ctx.file_access is not None:
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            # The editor creates the file; its folders are made here, confined to the root.
            with open_directory(target.root, target.relative.parent, create=True):
                pass
            if ctx.file_access.write_text(target.real, text):
                info = lstat(target.root, target.relative)
                return FileStamp(
                    size=len(payload),
                    mtime_ns=info.st_mtime_ns if info is not None else 0,
                    sha256=hashlib.sha256(payload).hexdigest(),
                )
    info = atomic_write(target.root, target.relative, payload)
    return FileStamp.of_bytes(payload, info)
