"""The `edit` tool: replace an exact piece of text in a file the agent has read.

Exactness is the point: the target must appear exactly once (unless
`replace_all`), so an edit never lands somewhere the model did not mean.
When it does not match, the closest lines in the file come back so the
model can correct itself instead of guessing. Files are decoded with
surrogateescape, so bytes that are not UTF-8 survive an edit untouched.
With an editor attached (tools.files.access) a UTF-8 file's text is the
editor's, and the result is written through it.
"""

from __future__ import annotations

import difflib
import re
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
from tools.files.read import looks_binary
from tools.workspace.paths import ResolvedPath
from tools.workspace.safe_fs import lstat, read_bytes


class EditArgs(Arguments):
    path: str = Field(description="File to edit, relative to the workspace root.")
    old_string: str = Field(
        min_length=1, description="Exact text to replace, including whitespace and indentation."
    )
    new_string: str = Field(description="Text to put in its place.")
    replace_all: bool = Field(
        default=False, description="Replace every occurrence instead of exactly one."
    )


def _line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def closest_lines(text: str, needle: str, max_snippets: int = 2) -> list[tuple[int, int, float]]:
    """The windows of `text` most similar to `needle`: (first line, last line, ratio)."""
    lines = text.replace("\r\n", "\n").split("\n")
    wanted = needle.replace("\r\n", "\n").strip("\n")
    size = max(1, wanted.count("\n") + 1)
    scored: list[tuple[float, int]] = []
    floor = 0.0
    for start in range(max(1, len(lines) - size + 1)):
        window = "\n".join(lines[start : start + size])
        matcher = difflib.SequenceMatcher(None, window, wanted, autojunk=False)
        if matcher.real_quick_ratio() <= floor or matcher.quick_ratio() <= floor:
            continue
        ratio = matcher.ratio()
        scored.append((ratio, start))
        if len(scored) >= 4 * max_snippets:
            scored.sort(reverse=True)
            del scored[2 * max_snippets :]
            floor = scored[-1][0]
    scored.sort(reverse=True)
    picked: list[tuple[int, int, float]] = []
    for ratio, start in scored:
        if ratio < 0.4 or len(picked) == max_snippets:
            break
        if all(abs(start + 1 - first) >= size for first, _, _ in picked):
            picked.append((start + 1, min(start + size, len(lines)), ratio))
    return picked


def _no_match_message(target: ResolvedPath, text: str, needle: str) -> str:
    message = [f"old_string was not found in {target.display}."]
    squash = re.compile(r"\s+")
    if squash.sub(" ", needle).strip() and squash.sub(" ", needle).strip() in squash.sub(" ", text):
        message.append(
            "It does match if whitespace is ignored: check indentation, tabs and spaces."
        )
    if "\\n" in needle and needle.replace("\\n", "\n") in text:
        message.append("It matches with real newlines instead of the two characters '\\n'.")
    lines = text.replace("\r\n", "\n").split("\n")
    for first, last, ratio in closest_lines(text, needle):
        snippet = "\n".join(f"{n:>6}\t{lines[n - 1]}" for n in range(first, last + 1))
        message.append(f"Closest match, lines {first}-{last} ({ratio:.0%} similar):\n{snippet}")
    if len(message) == 1:
        message.append("Nothing similar was found; read the file again to see its current text.")
    message.append("Retry with old_string copied exactly from the file.")
    return "\n".join(message)


class EditTool(Tool):
    name = "edit"
    description = (
        "Replace exact text in a file. old_string must match the file exactly (whitespace "
        "included) and appear exactly once, unless replace_all is true; include enough "
        "surrounding lines to make it unique. The file must have been read first."
    )
    effect = Effect.WRITE
    Args = EditArgs

    def access(self, args: EditArgs) -> ToolAccess:
        return ToolAccess(effect=self.effect, summary=f"Edit {args.path}", paths=(args.path,))

    def run(self, args: EditArgs, ctx: ToolContext) -> ToolResult:
        if args.old_string == args.new_string:
            return ToolResult.error("old_string and new_string are identical; nothing to change.")
        return modify_locked(args.path, ctx, "edit", lambda target: self._edit(args, ctx, target))

    def _edit(self, args: EditArgs, ctx: ToolContext, target: ResolvedPath) -> ToolResult:
        existing = lstat(target.root, target.relative)
        if existing is None:
            return ToolResult.error(f"{target.display} does not exist; use write to create it.")
        if not stat.S_ISREG(existing.st_mode):
            return ToolResult.error(f"{target.display} is not a regular file.")
        if existing.st_size > ctx.limits.edit_max_file_bytes:
            return ToolResult.error(
                f"{target.display} is {existing.st_size:,} bytes, over the "
                f"{ctx.limits.edit_max_file_bytes:,}-byte limit for edits."
            )
        data, info = read_bytes(target.root, target.relative)
        if looks_binary(data):
            return ToolResult.error(f"{target.display} is a binary file; it cannot be edited.")
        data = current_bytes(ctx, target.real, data)
        problem = staleness_problem(ctx, target, data, info, "edit")
        if problem:
            return ToolResult.error(problem)
        text = data.decode("utf-8", errors="surrogateescape")
        old, new, count = self._match(text, args.old_string, args.new_string)
        if count == 0:
            return ToolResult.error(_no_match_message(target, text, args.old_string))
        if count > 1 and not args.replace_all:
            where = self._match_lines(text, old)
            return ToolResult.error(
                f"old_string appears {count} times in {target.display} (lines {where}). "
                "Include more surrounding lines to make it unique, or set replace_all=true."
            )
        updated = text.replace(old, new) if args.replace_all else text.replace(old, new, 1)
        payload = updated.encode("utf-8", errors="surrogateescape")
        ctx.file_states.record(target.real, write_file(ctx, target, payload))
        diff, cut = unified_diff(text, updated, target.display, ctx.limits.diff_max_chars)
        noun = "replacement" if count == 1 else "replacements"
        return ToolResult.success(
            f"Edited {target.display}: {count} {noun}.\n{diff}",
            truncated=cut,
            path=target.display,
            replacements=count,
            diff=diff,
        )

    @staticmethod
    def _match(text: str, old: str, new: str) -> tuple[str, str, int]:
        """Find `old` in the file's own line-ending convention first, then as written.

        Models write LF; a CRLF file gets the model's text converted to CRLF,
        so both the match and the replacement keep the file's line endings.
        """
        style = newline_style(text)
        candidates = [(to_newline(old, style), to_newline(new, style)), (old, new)]
        for candidate_old, candidate_new in candidates:
            count = text.count(candidate_old)
            if count:
                return candidate_old, candidate_new, count
        return old, new, 0

    @staticmethod
    def _match_lines(text: str, needle: str, limit: int = 10) -> str:
        lines, start = [], 0
        while (index := text.find(needle, start)) != -1 and len(lines) < limit:
            lines.append(str(_line_of(text, index)))
            start = index + 1
        return ", ".join(lines)
