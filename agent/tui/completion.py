"""What the input box offers to complete: slash commands, their arguments, `@path`s.

Pure functions over the text before the cursor; the widget draws the menu.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.commands import APPROVAL_MODES, SLASH_COMMANDS
from agent.core.custom_commands import CustomCommand

MAX_ITEMS = 30
AT_PATH = re.compile(r"(?:^|\s)@([^\s@]*)$")


@dataclass(frozen=True)
class Item:
    label: str  # shown in the menu
    insert: str  # replaces the text from `start` to the cursor
    help: str = ""


@dataclass(frozen=True)
class Completions:
    start: int  # column in the cursor's line where the replaced text begins
    items: list[Item]


def _commands(line: str, custom: Sequence[CustomCommand]) -> Completions | None:
    word = line.lower()
    items = [
        Item(c.name, c.name + (" " if c.usage else ""), f"{c.usage} {c.help}".strip())
        for c in SLASH_COMMANDS
        if c.name.startswith(word)
    ]
    items += [  # after the built-ins, whose names they never take
        Item(
            c.slash_name,
            c.slash_name + (" " if c.takes_arguments else ""),
            f"{c.argument_hint} {c.description}".strip(),
        )
        for c in custom
        if c.slash_name.startswith(word)
    ]
    if len(items) == 1 and items[0].insert.strip() == line:
        return None  # already complete
    return Completions(0, items) if items else None


def _modes(line: str, prefix: str) -> Completions | None:
    typed = line[len(prefix) :]
    items = [Item(m, m) for m in APPROVAL_MODES if m.startswith(typed) and m != typed]
    return Completions(len(prefix), items) if items else None


def rank_paths(query: str, files: Sequence[str], limit: int = MAX_ITEMS) -> list[str]:
    """Paths that start with the query, then whose file name does, then that contain it."""
    q = query.lower()
    starts, names, contains = [], [], []
    for path in files:
        low = path.lower()
        if low.startswith(q):
            starts.append(path)
        elif low.rsplit("/", 1)[-1].startswith(q):
            names.append(path)
        elif q in low:
            contains.append(path)
        if len(starts) >= limit:
            break
    return (starts + names + contains)[:limit]


def wants_commands(line_before_cursor: str, *, first_line: bool) -> bool:
    """Whether `complete` would offer command names (so custom commands are read only
    then, not at every key)."""
    return first_line and line_before_cursor.startswith("/") and " " not in line_before_cursor


def complete(
    line_before_cursor: str,
    *,
    first_line: bool,
    files: Sequence[str],
    commands: Sequence[CustomCommand] = (),
) -> Completions | None:
    """Completions for the cursor's line up to the cursor; None when there are none.
    `commands`: the custom commands, offered after the built-ins."""
    if first_line and line_before_cursor.startswith("/"):
        if wants_commands(line_before_cursor, first_line=first_line):
            return _commands(line_before_cursor, commands)
        if line_before_cursor.lower().startswith("/approval "):
            return _modes(line_before_cursor, "/approval ")
        return None
    match = AT_PATH.search(line_before_cursor)
    if match is None:
        return None
    query = match.group(1)
    paths = rank_paths(query, files)
    if not paths or paths == [query]:
        return None
    return Completions(match.start(1) - 1, [Item("@" + p, "@" + p + " ") for p in paths])
