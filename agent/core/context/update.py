"""A new epoch's update section: the previous snapshot's text kept, the changes appended.

The engine's prefix cache serves a prompt up to its first changed token, so
re-rendering the snapshot at a new epoch costs everything from the first
changed file on, and an old file edited costs almost the whole block. A new
epoch after a full snapshot therefore keeps the previous text byte for byte
and appends one `<repository_update>` section: the current version of each
changed and added file, marked with the hash of the version it replaces, and
the removed files. Sections accumulate (epoch N+1's text is epoch N's text
plus one more section), so each epoch prefills only what changed since the
last one; the last copy of a path in the block is its current version.

The copies that a later version replaced stay in the prompt, and they cost
context. snapshot.py keeps the text only while those superseded copies stay
within a share of the current files' bytes (see DEFAULT_SUPERSEDED_FRACTION)
and the whole block within the snapshot's token budget; past either, it
re-renders the block in the stable order (ordering.py), which drops them.
It re-renders too when all the changes sit at the tail of a block without
updates (`Changes.only_at_tail`, the usual case for files being worked on):
that keeps the same prefix and no superseded copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape

from agent.core.context.selection import RepoFile

# Superseded copies may hold up to this share of the current files' bytes.
# Twice the default `stale_fraction` (0.25): an epoch that stale files trigger
# supersedes just over a quarter of the bytes, so it keeps its prefix, as do the
# small epochs (a compaction, a new tool list, a few edits) after it; the next
# epoch triggered by staleness re-renders and starts clean. The snapshot's
# token budget bounds the whole block besides.
DEFAULT_SUPERSEDED_FRACTION = 0.5

UPDATE_NOTE = (
    "Files changed since the block above. Each file here replaces every earlier"
    " copy of its path; the removed files are gone.\n"
)


@dataclass(frozen=True)
class Changes:
    """What changed between the previous snapshot's current files and the working tree."""

    # (now, the version it replaces or None when added), in the new stable order
    updated: list[tuple[RepoFile, RepoFile | None]]
    removed: list[RepoFile]

    def __bool__(self) -> bool:
        return bool(self.updated or self.removed)

    @property
    def superseded_bytes(self) -> int:
        """Bytes of the versions this update makes out of date (changed or removed)."""
        replaced = sum(before.size for _, before in self.updated if before is not None)
        return replaced + sum(f.size for f in self.removed)

    def only_at_tail(self, previous: list[RepoFile]) -> bool:
        """No unchanged file follows the first changed or removed one in `previous`'s
        order: a block rendered from that order again loses no more of its cached
        prefix than an update would, and holds no superseded copy."""
        touched = {f.path for f, _ in self.updated} | {f.path for f in self.removed}
        paths = [f.path for f in previous]
        first = next((i for i, path in enumerate(paths) if path in touched), len(paths))
        return all(path in touched for path in paths[first:])


def find_changes(ordered: list[RepoFile], previous: list[RepoFile]) -> Changes:
    """`ordered`: the current files in the new stable order (ordering.next_order);
    `previous`: the previous snapshot's current files."""
    before = {f.path: f for f in previous}
    now = {f.path for f in ordered}
    updated = []
    for file in ordered:
        old = before.get(file.path)
        if old is None or old.sha256 != file.sha256:
            updated.append((file, old))
    removed = [f for f in previous if f.path not in now]
    return Changes(updated, removed)


def render_update(
    epoch: int,
    changes: Changes,
    file_count: int,
    render_file: Callable[[RepoFile, str], str],
) -> str:
    """The section appended after the kept text. The epoch number and file count close it,
    as they close the repository block: nothing that stays cached comes after them."""
    parts = ["<repository_update>\n", UPDATE_NOTE]
    for file, old in changes.updated:
        mark = ' added="true"' if old is None else f' replaces="{old.short_hash}"'
        parts.append(render_file(file, mark))
    parts += [f'<removed path="{escape(f.path)}"/>\n' for f in changes.removed]
    parts.append(f'<snapshot epoch="{epoch}" files="{file_count}"/>\n</repository_update>\n')
    return "".join(parts)
