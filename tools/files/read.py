"""The `read` tool: numbered lines of a text file, a window at a time.

The file is opened through safe_fs (a symlink may lead elsewhere inside
the workspace, never out; a FIFO is refused without blocking) and streamed,
so a huge file costs memory only for the window shown. Reading records the file's stamp (size, mtime, hash) so that later
writes can tell whether it changed underneath the agent. When an editor
drives the agent (tools.files.access), a text file's content comes from the
editor, unsaved changes included; the path checks above happen first.
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack
from dataclasses import dataclass, field

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.files.access import editor_view
from tools.files.state import FileStamp
from tools.workspace.paths import PathError, resolve_path
from tools.workspace.safe_fs import NotRegularFileError, UnsafePathError, open_confined_file

BINARY_SNIFF_BYTES = 8192
_MAGIC = {
    b"\x89PNG": "PNG image",
    b"\xff\xd8\xff": "JPEG image",
    b"GIF8": "GIF image",
    b"%PDF": "PDF document",
    b"PK\x03\x04": "zip archive",
    b"\x7fELF": "ELF executable",
    b"\x1f\x8b": "gzip archive",
}


def looks_binary(head: bytes) -> bool:
    """Git's rule of thumb: a NUL byte early in the file means binary."""
    return b"\0" in head[:BINARY_SNIFF_BYTES]


def describe_binary(head: bytes) -> str:
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return "binary data"


class ReadArgs(Arguments):
    path: str = Field(description="File to read, relative to the workspace root.")
    offset: int = Field(default=1, ge=1, description="First line to show (1-based).")
    limit: int | None = Field(
        default=None, ge=1, description="How many lines to show (default: up to 2000)."
    )


@dataclass
class _Window:
    lines: list[str] = field(default_factory=list)
    chars: int = 0
    total_lines: int = 0
    last_shown: int = 0
    decode_errors: bool = False
    crlf: bool = False
    cut_for_size: bool = False


class ReadTool(Tool):
    name = "read"
    description = (
        "Read a text file. Returns lines prefixed with their line numbers (cat -n style). "
        "Use offset and limit to page through long files. Binary files are described, "
        "not shown. Reading a file is required before editing or overwriting it."
    )
    effect = Effect.READ
    Args = ReadArgs

    def access(self, args: ReadArgs) -> ToolAccess:
        return ToolAccess(effect=self.effect, summary=f"Read {args.path}", paths=(args.path,))

    def run(self, args: ReadArgs, ctx: ToolContext) -> ToolResult:
        with ExitStack() as stack:
            try:
                target = resolve_path(args.path, ctx.allowed_roots)
                # resolve_path already refused links leading out; opening through
                # safe_fs keeps it so even if a name on the way is swapped afterwards.
                opened = stack.enter_context(open_confined_file(target.root, target.relative))
            except (PathError, UnsafePathError) as exc:
                return ToolResult.error(str(exc))
            except FileNotFoundError:
                return ToolResult.error(f"{args.path} does not exist.")
            except IsADirectoryError:
                return ToolResult.error(f"{args.path} is a directory; use the list tool.")
            except NotRegularFileError:
                return ToolResult.error(
                    f"{args.path} is not a regular file (device, FIFO or socket)."
                )
            except OSError as exc:
                return ToolResult.error(f"cannot open {args.path}: {exc.strerror or exc}")
            handle, info = opened.file, opened.info
            real = target.root / opened.target  # target.real, unless a name changed meanwhile
            head = handle.read(BINARY_SNIFF_BYTES)
            if looks_binary(head):
                ctx.file_states.record(real, FileStamp.of_fd(handle.fileno()))
                return ToolResult.success(
                    f"{target.display} is a binary file ({describe_binary(head)}, "
                    f"{info.st_size:,} bytes); its content is not shown.",
                    binary=True,
                    size=info.st_size,
                    path=target.display,
                )
            handle.seek(0)
            source = editor_view(ctx, real, handle, info.st_size) or handle
            window, digest, size = self._scan(source, args, ctx)
        ctx.file_states.record(real, FileStamp(size=size, mtime_ns=info.st_mtime_ns, sha256=digest))
        # Cut by a cap (not by the window the model asked for) counts as truncated.
        capped = window.cut_for_size or (args.limit or 10**12) > ctx.limits.read_max_lines
        return self._render(target.display, args, window, size, capped)

    def _scan(self, handle, args: ReadArgs, ctx: ToolContext) -> tuple[_Window, str, int]:
        """One pass over the file: keep the window, count lines, hash everything."""
        limits = ctx.limits
        limit = min(args.limit or limits.read_max_lines, limits.read_max_lines)
        first, last = args.offset, args.offset + limit - 1
        max_line_bytes = limits.read_max_line_chars * 4 + 2
        digest = hashlib.sha256()
        size = 0
        window = _Window()
        line_number = 0
        while True:
            piece = handle.readline(max_line_bytes)
            if not piece:
                break
            digest.update(piece)
            size += len(piece)
            line_number += 1
            complete = piece.endswith(b"\n")
            extra = 0
            while not complete:  # a line longer than we will ever show: skip the rest
                rest = handle.readline(1 << 20)
                if not rest:
                    break
                digest.update(rest)
                size += len(rest)
                extra += len(rest)
                complete = rest.endswith(b"\n")
            if piece.endswith(b"\r\n"):
                window.crlf = True
            if first <= line_number <= last and not window.cut_for_size:
                self._keep(window, line_number, piece, extra, ctx)
        window.total_lines = line_number
        return window, digest.hexdigest(), size

    @staticmethod
    def _keep(window: _Window, number: int, piece: bytes, extra: int, ctx: ToolContext) -> None:
        raw = piece.rstrip(b"\n").rstrip(b"\r")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if extra and exc.reason == "unexpected end of data":
                text = raw[: exc.start].decode("utf-8", errors="replace")  # we cut mid-character
            else:
                text = raw.decode("utf-8", errors="replace")
                window.decode_errors = True
        cap = ctx.limits.read_max_line_chars
        if len(text) > cap or extra:
            text = f"{text[:cap]}… [line truncated; {len(raw) + extra:,} bytes in all]"
        rendered = f"{number:>6}\t{text}"
        if window.chars + len(rendered) > ctx.limits.read_max_output_chars and window.lines:
            window.cut_for_size = True
            return
        window.lines.append(rendered)
        window.chars += len(rendered) + 1
        window.last_shown = number

    @staticmethod
    def _render(
        display: str, args: ReadArgs, window: _Window, size: int, capped: bool
    ) -> ToolResult:
        total = window.total_lines
        data = {
            "path": display,
            "total_lines": total,
            "first_line": args.offset,
            "last_line": window.last_shown,
            "size": size,
            "crlf": window.crlf,
            "decode_errors": window.decode_errors,
        }
        if total == 0:
            return ToolResult.success(f"[{display} is empty.]", **data)
        if args.offset > total:
            return ToolResult.error(
                f"{display} has {total} lines; offset {args.offset} is past the end.", **data
            )
        notes = []
        more = window.last_shown < total
        truncated = more and capped
        if more:
            notes.append(
                f"[Showing lines {args.offset}-{window.last_shown} of {total}. "
                f"Use offset={window.last_shown + 1} to read more.]"
            )
        if window.decode_errors:
            notes.append(
                "[The file is not valid UTF-8; undecodable bytes are shown as U+FFFD. "
                "Edits keep the original bytes elsewhere in the file.]"
            )
        if window.crlf:
            notes.append("[The file uses CRLF line endings; edits keep them.]")
        output = "\n".join(window.lines + notes)
        return ToolResult.success(output, truncated=truncated, **data)
