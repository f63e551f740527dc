"""AGENTS.md files: the repository's instructions for agents, root and nested.

Each applies to its directory and below, so they go into the system prompt
shallowest first, each under its path; a deeper file then reads as the more
specific word. They come from the workspace's visible files, so an ignored
or vendored AGENTS.md does not speak for the project.

They are read through safe_fs: an AGENTS.md linking to another file in the
workspace (AGENTS.md -> CLAUDE.md is common) is read; one whose link leads
outside the workspace is skipped, and the skip is returned to the caller
(the snapshot's omitted list names the same file with the same reason); so
is a FIFO or device, without waiting on it. At most MAX_BYTES of each file
are read, whole lines, with a line saying when the rest was left out. None is
taken from Resident's own folders (config, data, cache) where they lie inside
the workspace, nor through a link leading there (tools.workspace.walk).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import prompts
from tools.workspace.safe_fs import OutsideLinkError, read_confined_bytes
from tools.workspace.walk import leads_into, left_out, visible_files

FILE_NAME = "AGENTS.md"
MAX_BYTES = 64 * 1024  # per file: instructions, not a manual
# The snapshot's omitted list names such a link with the same words (selection.py).
PROTECTED_LINK = "symbolic link into Resident's own folders (config, data, cache)"


def find_agents_files(workspace: Path, protected: Iterable[Path] | None = None) -> list[str]:
    listed = visible_files(workspace, workspace, protected)
    found = [p for p in listed if PurePosixPath(p).name == FILE_NAME]
    return sorted(found, key=lambda p: (len(PurePosixPath(p).parts), p))


@dataclass
class AgentsFiles:
    texts: list[tuple[str, str]] = field(default_factory=list)  # (path, text), shallowest first
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def read_agents_files(workspace: Path, protected: Iterable[Path] | None = None) -> AgentsFiles:
    """`protected`: folders left out by real path (tools.workspace.walk.left_out; None: the
    user's Resident folders as this process places them)."""
    found = AgentsFiles()
    folders = left_out(workspace, protected)
    root = Path(os.path.realpath(workspace))
    for path in find_agents_files(workspace, folders):
        try:
            read = read_confined_bytes(workspace, PurePosixPath(path), MAX_BYTES)
            if read.target.as_posix() != path and leads_into(root / read.target, folders):
                found.skipped.append((path, PROTECTED_LINK))
                continue
        except OutsideLinkError:
            found.skipped.append((path, "symbolic link leading outside the workspace"))
            continue
        except OSError as exc:  # gone, a FIFO or directory, unreadable
            found.skipped.append((path, exc.strerror or type(exc).__name__))
            continue
        data = read.data
        if read.truncated:  # whole lines only, and the model is told the rest is missing
            data = data[: data.rfind(b"\n") + 1]
        text = data.decode("utf-8", errors="replace").strip()
        if read.truncated:
            text += f"\n[{path} is over {MAX_BYTES // 1024} KiB: the rest of it is not read]"
        if text:
            found.texts.append((path, text))
    return found


def agents_instructions(workspace: Path, protected: Iterable[Path] | None = None) -> str:
    """The system-prompt section for the repository's AGENTS.md files ('' when none)."""
    sections = [
        f'<agents_md path="{path}">\n{text}\n</agents_md>'
        for path, text in read_agents_files(workspace, protected).texts
    ]
    if not sections:
        return ""
    return prompts.load("agents_md", files="\n\n".join(sections))
