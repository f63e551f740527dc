"""Glob patterns (as git and shells write them) translated to regular expressions.

`*` and `?` never cross a `/`; `**` between slashes (or at either end) spans
any number of directories; `[...]` is a character class (`!` or `^`
negates); a backslash quotes the next character; `{a,b}` alternation is
optional, since gitignore does not have it but file globs usually do.
"""

from __future__ import annotations

import re
from functools import lru_cache


def _class(pattern: str, start: int) -> tuple[str, int] | None:
    """Translate the class starting at pattern[start] == '['; None if it never closes."""
    i = start + 1
    negate = i < len(pattern) and pattern[i] in "!^"
    if negate:
        i += 1
    body: list[str] = []
    first = True
    while i < len(pattern):
        char = pattern[i]
        if char == "]" and not first:
            items = "".join(body)
            # A class never matches '/', negated or not.
            return (f"[^/{items}]" if negate else f"(?!/)[{items}]"), i + 1
        if char == "\\" and i + 1 < len(pattern):
            i += 1
            char = pattern[i]
        if char == "-" and body and i + 1 < len(pattern) and pattern[i + 1] != "]":
            body.append("-")
        else:
            body.append(re.escape(char) if char != "-" else r"\-")
        first = False
        i += 1
    return None


def _split_braces(body: str) -> list[str]:
    options, depth, current = [], 0, []
    for char in body:
        if char == "," and depth == 0:
            options.append("".join(current))
            current = []
            continue
        depth += char == "{"
        depth -= char == "}"
        current.append(char)
    options.append("".join(current))
    return options


def _closing_brace(pattern: str, start: int) -> int:
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "\\":
            continue
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def translate(pattern: str, *, braces: bool = False) -> str:
    """Regex source (without anchors) matching what `pattern` matches."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if char == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            starts_segment = i == 0 or pattern[i - 1] == "/"
            ends_segment = j == n or pattern[j] == "/"
            if j - i >= 2 and starts_segment and ends_segment:
                if j == n:
                    out.append(".*")  # "dir/**": everything below
                    i = j
                else:
                    out.append("(?:.*/)?")  # "**/": zero or more directories
                    i = j + 1
                continue
            out.append("[^/]*")
            i = j
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            translated = _class(pattern, i)
            if translated is None:
                out.append(re.escape(char))
                i += 1
            else:
                out.append(translated[0])
                i = translated[1]
        elif char == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        elif char == "{" and braces and (end := _closing_brace(pattern, i)) > i:
            options = _split_braces(pattern[i + 1 : end])
            if len(options) > 1:
                out.append("(?:" + "|".join(translate(o, braces=True) for o in options) + ")")
            else:
                out.append(re.escape("{") + translate(options[0], braces=True) + re.escape("}"))
            i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


@lru_cache(maxsize=512)
def compile_glob(pattern: str, *, braces: bool = True) -> re.Pattern[str]:
    """A compiled regex matching whole relative POSIX paths against a file glob."""
    return re.compile(r"\A" + translate(pattern.lstrip("/"), braces=braces) + r"\Z", re.DOTALL)


def glob_matches(pattern: str, relative_path: str) -> bool:
    """Shell-style glob match of a relative path; a pattern without '/' matches the basename
    at any depth only when written as '**/name' (as in shells with globstar)."""
    return compile_glob(pattern).match(relative_path) is not None
