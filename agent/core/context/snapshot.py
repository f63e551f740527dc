"""Taking one snapshot of the repository: the resident block at the heart of the prompt.

The first snapshot of a session is deterministic for a given repository
state (files in the order ordering.py gives, hashes of their bytes, nothing
time-dependent), so two sessions over the same state produce the same tokens
and share the engine's prefix cache. What changes from epoch to epoch (the
epoch number, the file count) is written after the files, never before them.

A new epoch after a full snapshot keeps the previous text byte for byte and
appends an update section with the changed, added and removed files
(update.py), so the whole previous block stays a cached prefix wherever the
edited file sits. The block is rendered again instead (unchanged files in
place, changed and added ones at the end: ordering.py; no superseded
copies) when that keeps as much: the changes sit at the tail of a block
without updates; and when keeping would cost too much: the superseded
copies would pass their share of the current files, or the block its
budget. After a map, a snapshot is taken as the first one is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from html import escape
from pathlib import Path
from typing import Literal

from agent.core.context.ordering import change_times, first_order, next_order
from agent.core.context.repo_map import build_repo_map
from agent.core.context.selection import DEFAULT_MAX_FILE_BYTES, Omitted, RepoFile, select_files
from agent.core.context.update import DEFAULT_SUPERSEDED_FRACTION, find_changes, render_update

# Tokenizers pack at most about this many bytes of source into one token, so a
# repository over budget × this many bytes cannot fit: skip counting it whole.
MAX_BYTES_PER_TOKEN = 8


@dataclass
class Snapshot:
    epoch: int
    mode: Literal["full", "map"]
    text: str
    tokens: int
    files: list[RepoFile]  # shown in full, current versions (a full block: stable order)
    all_files: list[RepoFile]  # current versions, by path
    omitted: list[Omitted] = field(default_factory=list)
    superseded_bytes: int = 0  # out-of-date file copies the text still holds (update.py)
    updates: int = 0  # update sections appended since the block was last rendered

    def stamp_of(self, path: str) -> RepoFile | None:
        return self._by_path.get(path)

    def __post_init__(self) -> None:
        self._by_path = {f.path: f for f in self.all_files}


def render_file(file: RepoFile, attributes: str = "") -> str:
    """`attributes`: more of them for the opening tag, with a leading space."""
    newline = "" if file.text.endswith("\n") or not file.text else "\n"
    opening = f'<file path="{escape(file.path)}" sha256="{file.short_hash}"{attributes}>'
    return f"{opening}\n{file.text}{newline}</file>\n"


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
    max_superseded: float | None = DEFAULT_SUPERSEDED_FRACTION,
    protected: Iterable[Path] | None = None,
) -> Snapshot:
    """The whole repository when it fits `budget` tokens, else a ranked map.

    A full snapshot after a full `previous` one is `previous`'s text with the
    changes appended while the superseded copies stay within `max_superseded`
    of the current files' bytes (None: never) and the changes do not all sit
    at its tail; otherwise it is rendered again with the unchanged files in
    place (ordering.py). `protected`: folders never shown, by real path (select_files;
    None: the user's Resident folders as this process places them)."""
    files, omitted = select_files(workspace, max_file_bytes, protected)
    root_name = workspace.name
    total_bytes = sum(f.size for f in files)
    if total_bytes <= budget * MAX_BYTES_PER_TOKEN:
        times = change_times(workspace)
        if previous is not None and previous.mode == "full":
            ordered = next_order(files, previous.files, times)
            kept = _extend(
                previous, epoch, ordered, files, omitted, budget, count_tokens, max_superseded
            )
            if kept is not None:
                return kept
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


def _extend(
    previous: Snapshot,
    epoch: int,
    ordered: list[RepoFile],
    files: list[RepoFile],
    omitted: list[Omitted],
    budget: int,
    count_tokens: Callable[[str], int],
    max_superseded: float | None,
) -> Snapshot | None:
    """`previous`'s text kept and this epoch's changes appended; None when rendering
    again is as good (changes only at the tail), or the superseded copies would pass
    their bound, or the text the budget."""
    if max_superseded is None:
        return None
    changes = find_changes(ordered, previous.files)
    if not changes:  # a compaction or a new tool list: the block as it was, all cached
        kept = replace(previous, epoch=epoch, files=ordered, all_files=files, omitted=omitted)
        return kept if kept.tokens <= budget else None
    if not previous.updates and changes.only_at_tail(previous.files):
        return None  # the same prefix rendered again, and no superseded copy
    superseded = previous.superseded_bytes + changes.superseded_bytes
    if superseded > max_superseded * sum(f.size for f in ordered):
        return None
    text = previous.text + render_update(epoch, changes, len(ordered), render_file)
    tokens = count_tokens(text)
    if tokens > budget:
        return None
    updates = previous.updates + 1
    return Snapshot(epoch, "full", text, tokens, ordered, files, omitted, superseded, updates)
