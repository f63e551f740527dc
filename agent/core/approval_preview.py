"""What a tool call waiting for approval would do, for a person to judge.

File changes become a before/after pair of the file (a front end draws the
diff); commands become their command line. Reading the workspace is the only
side effect, and only inside the workspace: a path that resolves elsewhere
gets no preview, just the request text. A front end whose editor holds the
file's live text (ACP) passes that text instead, so the diff is of what the
change will really apply to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.core.tool_runner import ApprovalRequest
from tools.workspace.bounded_read import read_bounded
from tools.workspace.paths import PathError, resolve_path

MAX_PREVIEW_BYTES = 512 * 1024


@dataclass(frozen=True)
class DiffPreview:
    path: str
    before: str
    after: str


@dataclass(frozen=True)
class CommandPreview:
    command: str
    workdir: str | None = None


Preview = DiffPreview | CommandPreview | None


def _read(workspace: Path, raw: str) -> str | None:
    """The file's text, "" when it does not exist yet, None when it cannot be shown."""
    try:
        resolved = resolve_path(raw, [workspace])
    except PathError:
        return None
    path = resolved.real
    if not path.exists():
        return ""
    try:  # bounded: a FIFO or a huge file must not stall the approval question
        text = read_bounded(path, MAX_PREVIEW_BYTES).decode("utf-8")
        return text.replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
    except (OSError, UnicodeDecodeError):  # not a regular file, too large, unreadable
        return None


def _edit(workspace: Path, args: dict, current: str | None) -> DiffPreview | None:
    path, old, new = args.get("path"), args.get("old_string"), args.get("new_string")
    if not isinstance(path, str) or not isinstance(old, str) or not isinstance(new, str):
        return None
    text = current if current is not None else _read(workspace, path)
    if text and old in text:
        count = -1 if args.get("replace_all") else 1
        return DiffPreview(path, text, text.replace(old, new, count))
    return DiffPreview(path, old, new)  # the file does not match (the tool will say): the strings


def _write(workspace: Path, args: dict, current: str | None) -> DiffPreview | None:
    path, content = args.get("path"), args.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return None
    before = current if current is not None else _read(workspace, path)
    return DiffPreview(path, before or "", content)


def preview(request: ApprovalRequest, workspace: Path, current: str | None = None) -> Preview:
    """`current`: the file's text as the user sees it, instead of the disk's."""
    args = request.arguments
    if request.tool == "edit":
        return _edit(workspace, args, current)
    if request.tool == "write":
        return _write(workspace, args, current)
    command = args.get("command")
    if isinstance(command, str):
        workdir = args.get("workdir")
        return CommandPreview(command, workdir if isinstance(workdir, str) else None)
    return None
