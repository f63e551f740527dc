"""Keeping the workspace's masked secret paths within what one bubblewrap command line carries.

bubblewrap refuses a command line of more than 9,000 arguments (MAX_ARGS in
bubblewrap.c, `--args` files included; measured with bubblewrap 0.11.0: 9,000
run, 9,003 fail with "Exceeded maximum number of arguments 9000"), and the
kernel refuses an argv larger than ARG_MAX ("Argument list too long", usually
2 MiB). Each masked file costs 3 arguments and each masked folder 4, so a
workspace holding thousands of secret-looking files (a folder of test keys,
/tmp) would break the sandbox for every command. Past the budget the folder
that holds the most masked paths is masked whole instead, repeatedly, until
the rest fits: every secret stays hidden, at the price of that folder's other
files, which a log line names.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import PurePath

Parts = tuple[str, ...]  # a path as its parts below the workspace: cheap to hash and sort

log = logging.getLogger(__name__)

BWRAP_MAX_ARGS = 9_000  # argv[0] included
# Masked paths on one command line: at most 4,000 arguments, which leaves more than
# half of bubblewrap's limit to the system, scratch, toolchain and workspace mounts.
MASK_PATH_BUDGET = 1_000
# Bytes those arguments take, far inside ARG_MAX even beside a large environment.
MASK_BYTES_BUDGET = 256 * 1024
_ARGUMENT_OVERHEAD = 64  # option names, /dev/null and argv pointers of one masked path

# Collapses already logged, each the set of folders hidden whole: a workspace's every
# command would otherwise repeat the same warning.
_logged_collapses: set[frozenset[PurePath]] = set()
_LOGGED_FOLDERS_SHOWN = 10


class MaskBudgetExceeded(Exception):
    """Only hiding the workspace itself would bring its masked paths within the budget."""


def collapse_masked(
    paths: Iterable[PurePath],
    workspace: PurePath,
    *,
    max_paths: int = MASK_PATH_BUDGET,
    max_bytes: int = MASK_BYTES_BUDGET,
) -> list[PurePath]:
    """The paths to mask for `paths` (secret files and folders inside `workspace`): sorted,
    without duplicates or paths inside another one (a masked folder hides what it holds),
    and within `max_paths` and `max_bytes` by masking whole folders.

    The folder chosen first is the one with the most masked entries directly in it (a
    subfolder holding some counts as one, as it would once collapsed), then the deeper,
    then by name: it gains the most while hiding the least. The workspace itself is never
    chosen; when nothing else brings the paths within budget, MaskBudgetExceeded."""
    if max_paths < 1 or max_bytes < 1:
        raise ValueError(f"mask budgets must be positive, not {max_paths} paths, {max_bytes} bytes")
    kept = _outermost_sorted(_relative(path, workspace) for path in paths)
    base = len(os.fsencode(str(workspace)))
    costs = [_cost(base, p) for p in kept]
    count, size = len(kept), sum(costs)
    if count > max_paths or size > max_bytes:
        collapsed = _collapse(kept, costs, base, max_paths, max_bytes)
        if collapsed is None:
            raise MaskBudgetExceeded(
                f"the workspace {workspace} holds {count:,} secret-looking files and folders, "
                f"too many to hide on one sandbox command line (at most {max_paths:,} paths, "
                f"{max_bytes:,} bytes) even with whole folders hidden, and hiding the workspace "
                "itself would hide everything"
            )
        hidden = [p for p in kept if any(p[:depth] in collapsed for depth in range(1, len(p)))]
        kept = sorted({*kept, *collapsed} - set(hidden))
        _log_collapse(workspace, collapsed)
    return [workspace.joinpath(*parts) for parts in kept]


def _relative(path: PurePath, workspace: PurePath) -> Parts:
    parts, root = path.parts, workspace.parts
    if len(parts) <= len(root) or parts[: len(root)] != root:
        raise ValueError(f"masked path {path} is not inside the workspace {workspace}")
    return parts[len(root) :]


def _cost(base: int, parts: Parts) -> int:
    # A masked folder names its path twice (--tmpfs P --remount-ro P); count every path so.
    path_bytes = base + sum(len(part.encode(errors="surrogateescape")) + 1 for part in parts)
    return 2 * (path_bytes + 1) + _ARGUMENT_OVERHEAD


def _outermost_sorted(paths: Iterable[Parts]) -> list[Parts]:
    kept: list[Parts] = []
    seen: set[Parts] = set()
    for parts in sorted(set(paths)):  # a folder sorts before what lies inside it
        if not any(parts[:depth] in seen for depth in range(1, len(parts))):
            kept.append(parts)
            seen.add(parts)
    return kept


def _collapse(
    kept: list[Parts], costs: list[int], base: int, max_paths: int, max_bytes: int
) -> dict[Parts, int] | None:
    """The folders to hide whole, each with how many masked paths it held, or None when
    only the workspace itself would do."""
    below_count: dict[Parts, int] = {}  # masked paths under each folder
    below_bytes: dict[Parts, int] = {}
    children: dict[Parts, set[Parts]] = {}  # its entries that are or hold masked paths
    for parts, cost in zip(kept, costs, strict=True):
        for depth in range(len(parts)):  # depth 0: the workspace
            folder = parts[:depth]
            below_count[folder] = below_count.get(folder, 0) + 1
            below_bytes[folder] = below_bytes.get(folder, 0) + cost
            children.setdefault(folder, set()).add(parts[: depth + 1])
    found_below = dict(below_count)  # for the log: what each folder held at first
    # Collapsing a folder leaves each remaining folder's entries as they were (a hidden
    # subfolder is still one entry), so one ordering serves the whole greedy run.
    candidates = sorted(
        (f for f, entries in children.items() if len(entries) >= 2 and f),
        key=lambda f: (-len(children[f]), -len(f), f),
    )
    count, size = len(kept), sum(costs)
    collapsed: dict[Parts, int] = {}
    for folder in candidates:
        if count <= max_paths and size <= max_bytes:
            break
        if any(folder[:depth] in collapsed for depth in range(1, len(folder))):
            continue  # already hidden by a folder collapsed before it
        fewer = below_count[folder] - 1
        smaller = below_bytes[folder] - _cost(base, folder)
        for depth in range(len(folder)):
            below_count[folder[:depth]] -= fewer
            below_bytes[folder[:depth]] -= smaller
        count, size = count - fewer, size - smaller
        collapsed[folder] = found_below[folder]
    if count > max_paths or size > max_bytes:
        return None
    # A folder hidden early may lie inside one hidden later: only the outermost remain.
    return {f: collapsed[f] for f in _outermost_sorted(collapsed)}


def _log_collapse(workspace: PurePath, collapsed: dict[Parts, int]) -> None:
    folders = frozenset(workspace.joinpath(*f) for f in collapsed)
    if folders in _logged_collapses:
        return
    _logged_collapses.add(folders)
    shown = sorted(collapsed)[:_LOGGED_FOLDERS_SHOWN]
    named = ", ".join(f"{workspace.joinpath(*f)} ({collapsed[f]:,})" for f in shown)
    more = len(collapsed) - len(shown)
    log.warning(
        "sandbox: too many secret-looking files to mask one by one; commands nobody "
        "approved see these folders empty, their other files included: %s%s",
        named,
        f" and {more:,} more folders" if more else "",
    )
