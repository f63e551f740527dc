"""Taking one snapshot of the repository: the resident block at the heart of the prompt.

The block is deterministic for a given repository state (files in the order
ordering.py gives, hashes of their bytes, nothing time-dependent), so two
sessions over the same state produce the same tokens and share the engine's
prefix cache. What changes from epoch to epoch (the epoch number, the file
count) is written after the files, never before them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Literal

from agent.core.context.ordering import change_times, first_order, next_order
from agent.core.context.repo_map import build_repo_map
from agent.core.context.selection import DEFAULT_MAX_FILE_BYTES, Omitted, RepoFile, select_files

# Tokenizers pack at most about this many bytes of source into one token, so a
# repository over budget × this many bytes cannot fit: skip counting it whole.
MAX_BYTES_PER_TOKEN = 8


@dataclass
class Snapshot:
    epoch: int
    mode: Literal["full", "map"]
    text: str
    tokens: int
    files: list[RepoFile]  # shown in full
    all_files: list[RepoFile]
    omitted: list[Omitted] = field(default_factory=list)

    def stamp_of(self, path: str) -> RepoFile | None:
        return self._by_path.get(path)

    def __post_init__(self) -> None:
        self._by_path = {f.path: f for f in self.all_files}


def render_file(file: RepoFile) -> str:
    newline = "" if file.text.endswith("\n") or not file.text else "\n"
    return f'<file path="{escape(file.path)}" sha256="{file.short_hash}">\n{file.text}{newline}</file>\n'


def render_full(root_name: str, epoch: int, files: list[RepoFile]) -> str:
    header = f'<repository root="{escape(root_name)}">\n'
    footer = f'<snapshot epoch="{epoch}" files="{len(files)}"/>\n</repository>\n'
    return header + "".join(render_file(f) for f in files) + footer


def take_snapshot(
    workspace: Path,
    epoch: int,
    budget: int,
    count_tokens: Callable[[str], int],
    task: str = "",
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    previous: Snapshot | None = None,
) -> Snapshot:
    """The whole repository when it fits `budget` tokens, else a ranked map.

    A full snapshot after a full `previous` one keeps its unchanged files in
    place (ordering.py)."""
    files, omitted = select_files(workspace, max_file_bytes)
    root_name = workspace.name
    total_bytes = sum(f.size for f in files)
    if total_bytes <= budget * MAX_BYTES_PER_TOKEN:
        times = change_times(workspace)
        if previous is not None and previous.mode == "full":
            ordered = next_order(files, previous.files, times)
        else:
            ordered = first_order(files, times)
        text = render_full(root_name, epoch, ordered)
        tokens = count_tokens(text)
        if tokens <= budget:
            return Snapshot(epoch, "full", text, tokens, ordered, files, omitted)
    header = (
        f'<repository root="{escape(root_name)}" epoch="{epoch}" mode="map" files="{len(files)}">'
    )
    repo_map = build_repo_map(files, budget, count_tokens, render_file, header, task)
    shown = {f.path for f in repo_map.shown}
    left_out = [Omitted(f.path, "only in the map") for f in files if f.path not in shown]
    return Snapshot(
        epoch, "map", repo_map.text, repo_map.tokens, repo_map.shown, files, omitted + left_out
    )
