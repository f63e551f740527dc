"""What `write` and `edit` share: refusing stale or unsafe targets, line endings, diffs."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable

from tools.base import ToolResult
from tools.context import ToolContext
from tools.files.state import FileStamp
from tools.workspace.paths import PathError, ResolvedPath, resolve_path
from tools.workspace.protected import state_dir_of
from tools.workspace.safe_fs import UnsafePathError


def resolve_for_write(raw: str, ctx: ToolContext) -> ResolvedPath:
    """Resolve a path a tool is about to modify; git internals and Resident's own folders
    are never written by file tools (the policy says so first; this holds even for a
    caller that skipped it)."""
    target = resolve_path(raw, ctx.allowed_roots)
    if target.is_git_internal:
        raise PathError(
            f"{raw!r} is inside .git; repository internals are not edited with file tools "
            "(a hook written there would run code). Use the git tools."
        )
    state = state_dir_of(target.real, ctx.protected_dirs)
    if state is not None:
        raise PathError(
            f"{raw!r} is inside {state.path} ({state.what}); file tools never change it: "
            "the user does, with an editor or Resident's own commands."
        )
    if target.relative.as_posix() == ".":
        raise PathError(f"{raw!r} is the workspace root, a directory")
    return target


def modify_locked(
    raw: str, ctx: ToolContext, verb: str, action: Callable[[ResolvedPath], ToolResult]
) -> ToolResult:
    """Resolve `raw` for writing and run `action` on it under the file's lock, turning
    path and OS failures into errors the model can act on (`verb`: "write", "edit")."""
    try:
        target = resolve_for_write(raw, ctx)
    except PathError as exc:
        return ToolResult.error(str(exc))
    with ctx.file_states.locked(target.real):
        try:
            return action(target)
        except UnsafePathError as exc:
            return ToolResult.error(
                f"Refusing to {verb} {raw}: a directory on its path is now a "
                f"symbolic link or not a directory ({exc.strerror})."
            )
        except OSError as exc:
            return ToolResult.error(f"Cannot {verb} {raw}: {exc.strerror or exc}")


def staleness_problem(
    ctx: ToolContext, target: ResolvedPath, data: bytes, info: os.stat_result, verb: str
) -> str | None:
    """Why `data` (the file's current content) must not be overwritten, or None.

    The agent must have read the file, and it must not have changed since.
    """
    recorded = ctx.file_states.get(target.real)
    if recorded is None:
        return (
            f"Refusing to {verb} {target.display}: it exists but has not been read in this "
            "session. Read it first, then retry."
        )
    current = FileStamp.of_bytes(data, info)
    if not current.same_content(recorded):
        return (
            f"Refusing to {verb} {target.display}: it changed since you last read it "
            f"({recorded.size:,} bytes then, {current.size:,} now; modified by someone else "
            "or by a command). Read it again and redo the change on the current content."
        )
    return None


def newline_style(text: str) -> str:
    """'\\r\\n' when most line breaks are CRLF, else '\\n'."""
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


def to_newline(text: str, newline: str) -> str:
    normalized = text.replace("\r\n", "\n")
    return normalized if newline == "\n" else normalized.replace("\n", "\r\n")


def unified_diff(before: str, after: str, path: str, limit: int) -> tuple[str, bool]:
    """A unified diff (line endings normalized for display), cut to `limit` chars."""
    diff = "".join(
        difflib.unified_diff(
            before.replace("\r\n", "\n").splitlines(keepends=True),
            after.replace("\r\n", "\n").splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )
    if len(diff) > limit:
        return diff[:limit] + f"\n… [diff truncated; {len(diff):,} chars in all]\n", True
    return diff, False
