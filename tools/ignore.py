"""A gitignore matcher for trees that are not git repositories.

Inside a repository the tools ask git itself (`git ls-files --exclude-standard`),
which knows every source of ignore rules. Outside one, this module applies
the rules of gitignore(5) to the `.gitignore` files found while walking:
later rules win over earlier ones, deeper files over shallower ones, `!`
re-includes, a trailing `/` matches directories only, a pattern with a `/`
before its end is anchored to its file's directory, and nothing inside an
ignored directory can be re-included (the walker never descends into one).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tools.globbing import translate


@dataclass(frozen=True)
class IgnoreRule:
    regex: re.Pattern[str]
    negated: bool
    directory_only: bool
    base: str  # directory of the .gitignore, relative to the walk root ("" for the root)
    source: str  # the pattern as written, for debugging and messages


def _strip_trailing_spaces(line: str) -> str:
    # Trailing spaces are ignored unless quoted with a backslash.
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    return stripped


def parse_rule(line: str, base: str = "") -> IgnoreRule | None:
    """One .gitignore line as a rule; None for blanks and comments."""
    line = line.rstrip("\r\n")
    if not line or line.startswith("#"):
        return None
    line = _strip_trailing_spaces(line)
    if not line:
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    directory_only = line.endswith("/") and not line.endswith("\\/")
    if directory_only:
        line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    body = translate(line.lstrip("/"))
    prefix = r"\A" if anchored else r"\A(?:.*/)?"
    return IgnoreRule(
        regex=re.compile(prefix + body + r"\Z", re.DOTALL),
        negated=negated,
        directory_only=directory_only,
        base=base,
        source=line,
    )


def parse_lines(lines: Iterable[str], base: str = "") -> list[IgnoreRule]:
    return [rule for line in lines if (rule := parse_rule(line, base)) is not None]


class IgnoreMatcher:
    """Rules gathered from .gitignore files, in precedence order (last match wins)."""

    def __init__(self, rules: Iterable[IgnoreRule] = ()) -> None:
        self.rules: list[IgnoreRule] = list(rules)

    def add_file(self, gitignore: Path, base: str) -> None:
        try:
            text = gitignore.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        self.rules.extend(parse_lines(text.splitlines(), base))

    def child(self, gitignore: Path, base: str) -> IgnoreMatcher:
        """A matcher for a subdirectory: these rules plus that directory's .gitignore."""
        matcher = IgnoreMatcher(self.rules)
        if gitignore.is_file():
            matcher.add_file(gitignore, base)
        return matcher

    def matches(self, relative: str, is_dir: bool) -> bool:
        """Whether this entry itself is ignored (its parents are assumed not to be)."""
        for rule in reversed(self.rules):
            if rule.directory_only and not is_dir:
                continue
            if rule.base:
                if not relative.startswith(rule.base + "/"):
                    continue
                candidate = relative[len(rule.base) + 1 :]
            else:
                candidate = relative
            if rule.regex.match(candidate):
                return not rule.negated
        return False

    def is_ignored(self, relative: str, is_dir: bool = False) -> bool:
        """Whether a path is ignored, its parent directories included."""
        parts = relative.split("/")
        for depth in range(1, len(parts)):
            if self.matches("/".join(parts[:depth]), is_dir=True):
                return True
        return self.matches(relative, is_dir)
