"""The order of files in the snapshot: stable files lead, so a new epoch keeps its prefix.

The engine's prefix cache serves a prompt up to its first changed token and
no further. Sorted by path, one edited file early in the order made every
file after it a cache miss at the next epoch. Two rules keep the changing
part at the tail instead:

- The first snapshot of a session orders files by when git last changed
  them, oldest first; files with uncommitted changes and untracked files come
  last. What the user and the agent are working on is what changed recently,
  so it starts out at the tail, where an edit costs little.
- A new epoch keeps every unchanged file where the previous snapshot had it
  and puts changed and added files after them; removed files drop out. A
  file edited in this session thus moves to the tail once and stays there.
  Most new epochs do not render this order: they keep the previous text and
  append the changed files in it (update.py), so even an old file's edit
  costs only that file. This order is rendered when the changes sit at the
  tail anyway, or when superseded copies pass update.py's bound; the
  cached prefix then runs up to the first file changed since the block was
  last rendered.

Both are deterministic for one repository state (commit times and the
working tree), so two sessions over the same state render the same tokens
and share the cache. Outside git, or when git fails, the first order is by
path.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from agent.core.context.selection import RepoFile
from tools.git.repo import GitError, find_repository, git_text

log = logging.getLogger(__name__)

# Commits read for change times: enough to tell the stable files from the
# active ones, bounded so a large history costs milliseconds, not seconds.
MAX_COMMITS = 2000
_UNCOMMITTED = math.inf


def change_times(workspace: Path) -> dict[str, float]:
    """When git last changed each file (seconds since the epoch), by workspace path;
    files with uncommitted changes map to infinity. Empty outside git."""
    try:
        repository = find_repository(workspace)
        if repository is None:
            return {}
        prefix = repository.prefix + "/" if repository.prefix else ""
        scope = ["--", "."] if not prefix else ["--", repository.prefix]
        log_text = git_text(
            repository,
            [
                "-c",
                "core.quotepath=off",
                "log",
                "-n",
                str(MAX_COMMITS),
                "--format=%x00%ct",
                "--name-only",
                "--no-renames",
                *scope,
            ],
            ok_codes=(0, 128),  # 128: a repository without commits
        )
        status = git_text(
            repository,
            ["status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all", *scope],
        )
    except (GitError, OSError) as error:
        log.info("no git change times for the snapshot order: %s", error)
        return {}
    times: dict[str, float] = {}
    for commit in log_text.split("\x00")[1:]:
        stamp, *paths = commit.strip("\n").split("\n")
        when = float(stamp)
        for path in paths:
            if path and path.startswith(prefix):
                times.setdefault(path[len(prefix) :], when)  # newest commit first
    entries = status.split("\x00")
    for entry in entries:
        path = entry[3:]
        if len(entry) > 3 and path.startswith(prefix):
            times[path[len(prefix) :]] = _UNCOMMITTED
    return times


def first_order(files: list[RepoFile], times: dict[str, float]) -> list[RepoFile]:
    """Least recently changed first; never-seen files count as oldest; ties by path."""
    return sorted(files, key=lambda f: (times.get(f.path, 0.0), f.path))


def next_order(
    files: list[RepoFile], previous: list[RepoFile], times: dict[str, float]
) -> list[RepoFile]:
    """Unchanged files where they were, then changed and added ones (in first_order)."""
    current = {f.path: f for f in files}
    kept = [current[f.path] for f in previous if _same(current.get(f.path), f)]
    kept_paths = {f.path for f in kept}
    moved = [f for f in files if f.path not in kept_paths]
    return kept + first_order(moved, times)


def _same(now: RepoFile | None, before: RepoFile) -> bool:
    return now is not None and now.sha256 == before.sha256
