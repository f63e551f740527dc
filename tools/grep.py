"""The `grep` tool: regex search over the project's files.

ripgrep runs when it is on PATH (fast, and it honours .gitignore itself);
otherwise a Python scan over the same non-ignored files does the job. Both
skip .git, binary files and files that usually hold secrets (read those
explicitly, with approval), and both stop at a cap on results.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.file_read import BINARY_SNIFF_BYTES, looks_binary
from tools.file_search import display_path, resolve_directory
from tools.globbing import compile_glob
from tools.paths import PathError, ResolvedPath, secret_reason
from tools.walk import visible_files

RG_TIMEOUT_S = 60.0


class GrepArgs(Arguments):
    pattern: str = Field(min_length=1, description="Regular expression to search for.")
    path: str = Field(default=".", description="Directory to search, relative to the workspace.")
    glob: str | None = Field(
        default=None, description="Only search files matching this glob, e.g. '*.py'."
    )
    case_insensitive: bool = Field(default=False, description="Ignore case.")
    files_only: bool = Field(
        default=False, description="List matching files instead of matching lines."
    )


@dataclass(frozen=True)
class Hit:
    path: str  # relative to the searched directory
    line: int  # 0 in files_only mode
    text: str


def _glob_filter(glob: str | None):
    if not glob:
        return lambda _path: True
    regex = compile_glob(glob)
    # Like ripgrep: a glob without '/' is matched against the file name.
    if "/" not in glob:
        return lambda path: regex.match(path.rsplit("/", 1)[-1]) is not None
    return lambda path: regex.match(path) is not None


def _is_secret(relative: str) -> bool:
    return secret_reason(Path(relative)) is not None


def python_search(
    base: ResolvedPath, args: GrepArgs, limit: int, ctx: ToolContext
) -> tuple[list[Hit], bool]:
    """Scan files in Python. Returns the hits (at most `limit`) and whether more existed."""
    regex = re.compile(args.pattern, re.IGNORECASE if args.case_insensitive else 0)
    wanted = _glob_filter(args.glob)
    hits: list[Hit] = []
    for relative in visible_files(base.root, base.real):
        if ctx.cancel_event.is_set():
            return hits, True
        if not wanted(relative) or _is_secret(relative):
            continue
        for hit in _search_file(base.real / relative, relative, regex, args.files_only):
            if len(hits) == limit:
                return hits, True
            hits.append(hit)
    return hits, False


def _search_file(path, relative: str, regex: re.Pattern[str], files_only: bool) -> Iterator[Hit]:
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            return  # symlinks are not followed, as ripgrep does by default
        with open(path, "rb") as handle:
            if looks_binary(handle.read(BINARY_SNIFF_BYTES)):
                return
            handle.seek(0)
            for number, raw in enumerate(handle, start=1):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if regex.search(text):
                    yield Hit(relative, 0 if files_only else number, "" if files_only else text)
                    if files_only:
                        return
    except OSError:
        return


class RipgrepRegexError(ValueError):
    pass


def ripgrep_search(
    rg: str, base: ResolvedPath, args: GrepArgs, limit: int, ctx: ToolContext
) -> tuple[list[Hit], bool]:
    command = [
        rg, "--no-config", "--no-messages", "--null", "--color=never", "--hidden",
        "--no-require-git", "--sort=path", "--glob=!.git",
    ]  # fmt: skip
    command += ["--files-with-matches"] if args.files_only else ["--line-number", "--no-heading"]
    if args.case_insensitive:
        command.append("--ignore-case")
    if args.glob:
        command += ["--glob", args.glob]
    command += ["--regexp", args.pattern, "--", "."]
    process = subprocess.Popen(
        command, cwd=base.real, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    hits: list[Hit] = []
    more = False
    deadline = time.monotonic() + RG_TIMEOUT_S
    try:
        assert process.stdout is not None
        records = _records(process.stdout, args.files_only)
        for path, number, text in records:
            if _is_secret(path):
                continue
            if len(hits) == limit:
                more = True
                break
            hits.append(Hit(path, number, text))
            if time.monotonic() > deadline or ctx.cancel_event.is_set():
                more = True
                break
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        stderr = process.stderr.read().decode("utf-8", errors="replace") if process.stderr else ""
        if process.stdout:
            process.stdout.close()
        if process.stderr:
            process.stderr.close()
    if process.returncode == 2 and not hits and "regex" in stderr.lower():
        raise RipgrepRegexError(stderr.strip())
    return hits, more


def _records(stream, files_only: bool) -> Iterator[tuple[str, int, str]]:
    """Parse `rg --null` output: 'path\\0' (files) or 'path\\0line:text\\n' (lines)."""
    if files_only:
        for item in stream.read().split(b"\0"):
            if item.strip():
                yield _clean(item.strip(b"\n")), 0, ""
        return
    for raw in stream:
        path, _, rest = raw.partition(b"\0")
        number, _, text = rest.partition(b":")
        if not number.isdigit():
            continue
        yield _clean(path), int(number), text.decode("utf-8", errors="replace").rstrip("\r\n")


def _clean(path: bytes) -> str:
    text = os.fsdecode(path)
    return text[2:] if text.startswith("./") else text


class GrepTool(Tool):
    name = "grep"
    description = (
        "Search file contents with a regular expression. Returns 'path:line:text' for each "
        "matching line (or only paths with files_only). Skips ignored, binary and "
        "secret-looking files (.env and the like)."
    )
    effect = Effect.READ
    Args = GrepArgs

    def access(self, args: GrepArgs) -> ToolAccess:
        return ToolAccess(
            effect=self.effect, summary=f"Search for {args.pattern!r} in {args.path}",
            paths=(args.path,),
        )  # fmt: skip

    def run(self, args: GrepArgs, ctx: ToolContext) -> ToolResult:
        try:
            base = resolve_directory(args.path, ctx)
        except PathError as exc:
            return ToolResult.error(str(exc))
        limit = ctx.limits.grep_max_results
        rg = shutil.which("rg") if ctx.use_ripgrep else None
        engine = "ripgrep" if rg else "python"
        try:
            if rg:
                try:
                    hits, more = ripgrep_search(rg, base, args, limit, ctx)
                except RipgrepRegexError:
                    # ripgrep's regex dialect lacks look-around; Python's has it.
                    engine = "python"
                    hits, more = python_search(base, args, limit, ctx)
            else:
                hits, more = python_search(base, args, limit, ctx)
        except re.error as exc:
            return ToolResult.error(f"Invalid regular expression {args.pattern!r}: {exc}")
        if not hits:
            return ToolResult.success(f"No matches for {args.pattern!r}.", matches=0, engine=engine)
        width = ctx.limits.grep_max_line_chars
        lines = []
        for hit in hits:
            shown = display_path(base, hit.path)
            if args.files_only:
                lines.append(shown)
                continue
            text = hit.text if len(hit.text) <= width else hit.text[:width] + "… [line truncated]"
            lines.append(f"{shown}:{hit.line}:{text}")
        if more:
            lines.append(f"[Stopped after {limit} results; narrow the pattern, path or glob.]")
        return ToolResult.success(
            "\n".join(lines), truncated=more, matches=len(hits), engine=engine
        )
