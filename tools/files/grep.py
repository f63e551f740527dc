"""The `grep` tool: regex search over the project's files.

ripgrep runs when it is on PATH (fast, and it honours .gitignore itself);
otherwise a Python scan over the same non-ignored files does the job. Both
skip .git, binary files and files that usually hold secrets (read those
explicitly, with approval), and both stop at a cap on results.

Symlinks: neither engine descends a directory link. ripgrep does not open
file links at all; the Python engine opens every file through safe_fs, so a
link to a file inside the workspace is searched (unless its target is listed
too, which is then searched under its own name) and a link leading outside
is skipped and counted in the result. Lines are read bounded: a longer line
is searched in its first GREP_MAX_LINE_BYTES only (ripgrep: shown cut).

Resident's own folders (config, data, cache) inside the searched directory are
never searched (tools.workspace.walk), nor a link leading into them: their
tokens and journals are read by name, which asks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.files.read import BINARY_SNIFF_BYTES, looks_binary
from tools.files.search import display_path, resolve_directory
from tools.workspace.globbing import compile_glob
from tools.workspace.paths import PathError, ResolvedPath, secret_reason
from tools.workspace.safe_fs import OutsideLinkError, open_confined_file
from tools.workspace.walk import covered, leads_into, left_out, names_left_out, visible_files

RG_TIMEOUT_S = 60.0
# A "line" longer than this (a minified bundle, a dump without newlines) is searched
# in its first GREP_MAX_LINE_BYTES only: reading it whole could hold the file in memory.
GREP_MAX_LINE_BYTES = 1 << 20
_DRAIN_BYTES = 1 << 16


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


@dataclass
class ScanNotes:
    """What the Python engine passed over, told in the result so nothing is silently missing."""

    outside_links: int = 0  # files whose symlink leads outside the workspace
    long_lines: int = 0  # lines searched only in their first GREP_MAX_LINE_BYTES


def python_search(
    base: ResolvedPath, args: GrepArgs, limit: int, ctx: ToolContext
) -> tuple[list[Hit], bool, ScanNotes]:
    """Scan files in Python. Returns the hits (at most `limit`), whether more existed, and
    what was skipped."""
    regex = re.compile(args.pattern, re.IGNORECASE if args.case_insensitive else 0)
    wanted = _glob_filter(args.glob)
    width = ctx.limits.grep_max_line_chars
    folders = left_out(base.real, ctx.protected_paths)
    listed = list(visible_files(base.root, base.real, folders))
    listed_set = set(listed)
    notes = ScanNotes()
    hits: list[Hit] = []
    for relative in listed:
        if ctx.cancel_event.is_set():
            return hits, True, notes
        if not wanted(relative) or _is_secret(relative):
            continue
        requested = base.relative / relative
        try:
            with open_confined_file(base.root, requested) as opened:
                if opened.target != requested and (
                    _listed_name(base, opened.target) in listed_set
                    or _is_secret(opened.target.as_posix())
                    or leads_into(base.root / opened.target, folders)
                ):
                    continue  # a link to a file searched under its own name, to a secret,
                    # or into Resident's own folders
                for hit in _search_file(opened.file, relative, regex, args.files_only, notes):
                    if len(hits) == limit:
                        return hits, True, notes
                    hits.append(Hit(hit.path, hit.line, hit.text[: width + 1]))
        except OutsideLinkError:
            notes.outside_links += 1
        except OSError:
            continue  # gone, a directory link, a FIFO or device, unreadable: not text to search
    return hits, False, notes


def _listed_name(base: ResolvedPath, target: PurePosixPath) -> str | None:
    """`target` (relative to the root) as the walk lists it (relative to `base`), or None
    when it lies outside the searched directory."""
    if not base.relative.parts:
        return target.as_posix()
    if target.is_relative_to(base.relative):
        return target.relative_to(base.relative).as_posix()
    return None


def bounded_lines(handle: BinaryIO, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """The file's lines, each at most `max_bytes`, with whether it was cut. The rest of a
    cut line is read in small pieces and dropped, so memory stays near `max_bytes`."""
    while piece := handle.readline(max_bytes):
        cut = False
        if not piece.endswith(b"\n"):  # stopped at the bound, or at the end of the file
            while rest := handle.readline(_DRAIN_BYTES):
                cut = cut or rest != b"\n"
                if rest.endswith(b"\n"):
                    break
        yield piece, cut


def _search_file(
    handle: BinaryIO, relative: str, regex: re.Pattern[str], files_only: bool, notes: ScanNotes
) -> Iterator[Hit]:
    if looks_binary(handle.read(BINARY_SNIFF_BYTES)):
        return
    handle.seek(0)
    for number, (raw, cut) in enumerate(bounded_lines(handle, GREP_MAX_LINE_BYTES), start=1):
        notes.long_lines += cut
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if regex.search(text):
            yield Hit(relative, 0 if files_only else number, "" if files_only else text)
            if files_only:
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
    # rg prints matching lines whole; a huge one is cut by rg itself (width chars can
    # take 4 bytes each), so no output line has to be held whole here.
    command += [f"--max-columns={4 * ctx.limits.grep_max_line_chars + 4}", "--max-columns-preview"]
    if args.case_insensitive:
        command.append("--ignore-case")
    if args.glob:
        command += ["--glob", args.glob]
    # Resident's own folders, after the model's glob (the last matching glob wins). The
    # output is checked against them too: the glob only spares reading them.
    skipped = names_left_out(base.real, ctx.protected_paths)
    command += [f"--glob=!/{_glob_literal(name)}" for name in skipped]
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
            if _is_secret(path) or (skipped and covered(path, skipped)):
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


def _glob_literal(name: str) -> str:
    """`name` as a glob matching only itself."""
    return re.sub(r"([\\*?\[\]{}!])", r"\\\1", name)


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
        notes = ScanNotes()
        try:
            if rg:
                try:
                    hits, more = ripgrep_search(rg, base, args, limit, ctx)
                except RipgrepRegexError:
                    # ripgrep's regex dialect lacks look-around; Python's has it.
                    engine = "python"
                    hits, more, notes = python_search(base, args, limit, ctx)
            else:
                hits, more, notes = python_search(base, args, limit, ctx)
        except re.error as exc:
            return ToolResult.error(f"Invalid regular expression {args.pattern!r}: {exc}")
        data = {
            "engine": engine,
            "skipped_outside_links": notes.outside_links,
            "long_lines": notes.long_lines,
        }
        if not hits:
            text = "\n".join([f"No matches for {args.pattern!r}.", *_footer(notes)])
            return ToolResult.success(text, matches=0, **data)
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
        lines += _footer(notes)
        return ToolResult.success("\n".join(lines), truncated=more, matches=len(hits), **data)


def _footer(notes: ScanNotes) -> list[str]:
    lines = []
    if notes.outside_links:
        lines.append(
            f"[Skipped {notes.outside_links} file(s) whose symbolic link leads outside "
            "the workspace.]"
        )
    if notes.long_lines:
        lines.append(
            f"[{notes.long_lines} line(s) longer than {GREP_MAX_LINE_BYTES // (1 << 20)} MiB "
            "were searched only in their first MiB.]"
        )
    return lines
