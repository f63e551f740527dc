"""AGENTS.md files: the repository's instructions for agents, root and nested.

Each applies to its directory and below, so they go into the system prompt
shallowest first, each under its path; a deeper file then reads as the more
specific word. They come from the workspace's visible files, so an ignored
or vendored AGENTS.md does not speak for the project.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import prompts
from tools.walk import visible_files

FILE_NAME = "AGENTS.md"
MAX_BYTES = 64 * 1024  # per file: instructions, not a manual


def find_agents_files(workspace: Path) -> list[str]:
    found = [p for p in visible_files(workspace, workspace) if PurePosixPath(p).name == FILE_NAME]
    return sorted(found, key=lambda p: (len(PurePosixPath(p).parts), p))


def agents_instructions(workspace: Path) -> str:
    """The system-prompt section for the repository's AGENTS.md files ('' when none)."""
    sections = []
    for path in find_agents_files(workspace):
        try:
            data = (workspace / path).read_bytes()[:MAX_BYTES]
        except OSError:
            continue
        text = data.decode("utf-8", errors="replace").strip()
        if text:
            sections.append(f'<agents_md path="{path}">\n{text}\n</agents_md>')
    if not sections:
        return ""
    return prompts.load("agents_md", files="\n\n".join(sections))
