"""The resident repository context (DESIGN.md §4).

selection (which files), snapshot (the block), ordering (its file order),
update (what a new epoch appends to the kept block), repo_map (when it does
not fit), agents_md (the repository's instructions), resident (layout,
epochs, staleness, token accounting).
"""

from agent.core.context.resident import ContextSettings, ResidentContext
from agent.core.context.selection import Omitted, RepoFile, select_files
from agent.core.context.snapshot import Snapshot, take_snapshot

__all__ = [
    "ContextSettings",
    "Omitted",
    "RepoFile",
    "ResidentContext",
    "Snapshot",
    "select_files",
    "take_snapshot",
]
