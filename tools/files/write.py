"""The `write` tool: create a file or replace one the agent has read, atomically.

With an editor attached (tools.files.access) the old content is the editor's
and the new one is written through it.
"""

from __future__ import annotations

import stat

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.files.access import current_bytes, write_file
from tools.files.guard import (
    modify_locked,
    newline_style,
    staleness_problem,
    to_newline,
    unified_diff,
)
from tools.workspace.safe_fs import lstat, read_bytes


class WriteArgs(Arguments):
    path: str = Field(description="File to write, relative to the workspace root.")
    content: str = Field(description="The complete new content of the file.")


class WriteTool(Tool):
    name = "write"
    description = (
        "Write a whole file: create it (parent directories included) or replace it. "
        "An existing file must have been read first and must not have changed since. "
        "Prefer edit for changing part of a file."
    )
    effect = Effect.WRITE
    Args = WriteArgs

    def access(self, args: WriteArgs) -> ToolAccess:
        return ToolAccess(effect=self.effect, summary=f"Write {args.path}", paths=(args.path,))

    def run(self, args: WriteArgs, ctx: ToolContext) -> ToolResult:
        return modify_locked(args.path, ctx, "write", lambda target: self._write(args, ctx, target))

    def _write(self, args: WriteArgs, ctx: ToolContext, target) -> ToolResult:
        existing = lstat(target.root, target.relative)
        before = None
        content = args.content
        if existing is not None:
            if not stat.S_ISREG(existing.st_mode):
                return ToolResult.error(f"{target.display} exists and is not a regular file.")
            old_bytes, info = read_bytes(target.root, target.relative)
            old_bytes = current_bytes(ctx, target.real, old_bytes)
            problem = staleness_problem(ctx, target, old_bytes, info, "overwrite")
            if problem:
                return ToolResult.error(problem)
            before = old_bytes.decode("utf-8", errors="surrogateescape")
            if newline_style(before) == "\r\n" and "\r\n" not in content:
                content = to_newline(content, "\r\n")  # keep the file's convention
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            return ToolResult.error(f"content is not valid Unicode text: {exc.reason}")
        ctx.file_states.record(target.real, write_file(ctx, target, data))
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        if before is None:
            return ToolResult.success(
                f"Created {target.display} ({lines} lines, {len(data):,} bytes).",
                path=target.display,
                created=True,
            )
        diff, diff_cut = unified_diff(before, content, target.display, ctx.limits.diff_max_chars)
        return ToolResult.success(
            f"Overwrote {target.display} ({lines} lines, {len(data):,} bytes).\n{diff}",
            truncated=diff_cut,
            path=target.display,
            created=False,
            diff=diff,
        )
