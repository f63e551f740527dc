"""A gitignore matcher for trees that are not git repositories.

Inside a repository the tools ask git itself (`git ls-files --exclude-standard`),
which knows every source of ignore rules. Outside one, this module applies
the rules of gitignore(5) to the `.gitignore` files found while walking:
later rules win over earlier ones, deeper files over shallower ones, `!`
re-includes, a trailing `/` matches directories only, a pattern with a `/`
before its end is anchored to its file's directory, and nothing inside an
ignored directory can be re-included (the walker never descends into one).

Ignore files are read through safe_fs, capped at MAX_IGNORE_FILE_BYTES, and,
like git since 2.32, never through a symbolic link: a `.gitignore` that is a
link (inside the workspace or out) contributes no rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tools.workspace.globbing import translate
from tools.workspace.safe_fs import read_confined_bytes

# Real ignore files are a few kilobytes; past this the rest is not read.
MAX_IGNORE_FILE_BYTES = 1 << 20


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


def read_rules_file(root: Path, relative: PurePosixPath, base: str = "") -> list[IgnoreRule]:
    """The rules of the ignore file root/relative ([] when it is missing, a link, not a
    regular file or unreadable), from at most its first MAX_IGNORE_FILE_BYTES."""
    try:
        read = read_confined_bytes(root, relative, MAX_IGNORE_FILE_BYTES, follow_links=False)
    except OSError:
        return []
    data = read.data
    if read.truncated:
        data = data[: data.rfind(b"\n") + 1]  # whole lines only: never half a pattern
    return parse_lines(data.decode("utf-8", errors="replace").splitlines(), base)


class IgnoreMatcher:
    """Rules gathered from .gitignore files, in precedence order (last match wins)."""

    def __init__(self, rules: Iterable[IgnoreRule] = ()) -> None:
        self.rules: list[IgnoreRule] = list(rules)

    def add_file(self, root: Path, relative: PurePosixPath, base: str) -> None:
        """Add the rules of root/relative (an ignore file in directory `base`), if any."""
        self.rules.extend(read_rules_file(root, relative, base))

    def child(self, root: Path, relative: PurePosixPath, base: str) -> IgnoreMatcher:
        """A matcher for a subdirectory: these rules plus that directory's ignore file."""
        matcher = IgnoreMatcher(self.rules)
        matcher.add_file(root, relative, base)
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
