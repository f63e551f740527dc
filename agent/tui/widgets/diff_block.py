"""File changes drawn as diffs (textual-diff-view), from before/after text or a unified diff.

Tools report their changes as unified diffs. To draw one with real line
numbers, each file's hunks are laid back onto two sparse copies of the file:
the lines between hunks are unique filler lines, equal on both sides, which
the diff view folds away because the hunks already carry their context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.containers import VerticalGroup
from textual.widgets import Static
from textual_diff_view import DiffView

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class FileDiff:
    path: str
    before: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    note: str = ""  # e.g. "binary file", "diff truncated"
    _gaps: int = 0

    def pad_to(self, old_start: int, new_start: int) -> None:
        self._gaps += 1
        gap = 0
        while len(self.before) < old_start - 1 or len(self.after) < new_start - 1:
            filler = f"\x00{self._gaps}:{gap}"
            if len(self.before) < old_start - 1:
                self.before.append(filler)
            if len(self.after) < new_start - 1:
                self.after.append(filler)
            gap += 1

    @property
    def before_text(self) -> str:
        return "\n".join(self.before) + ("\n" if self.before else "")

    @property
    def after_text(self) -> str:
        return "\n".join(self.after) + ("\n" if self.after else "")


def _path(header: str) -> str | None:
    name = header[4:].split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_unified_diff(text: str) -> list[FileDiff]:
    """Files and their hunks, in order; text that is not a diff gives []."""
    files: list[FileDiff] = []
    current: FileDiff | None = None
    old_path: str | None = None
    old_left = new_left = 0  # lines of the current hunk still to come
    for line in text.splitlines():
        if old_left > 0 or new_left > 0:
            mark, body = line[:1], line[1:]
            if mark == "\\":
                continue  # "\ No newline at end of file"
            if mark in (" ", "") and current is not None:
                current.before.append(body)
                current.after.append(body)
                old_left, new_left = old_left - 1, new_left - 1
                continue
            if mark == "-" and current is not None:
                current.before.append(body)
                old_left -= 1
                continue
            if mark == "+" and current is not None:
                current.after.append(body)
                new_left -= 1
                continue
            old_left = new_left = 0  # a cut diff: the hunk ends early
        if line.startswith("--- "):
            old_path = _path(line)
        elif line.startswith("+++ "):
            current = FileDiff(_path(line) or old_path or "?")
            files.append(current)
        elif (match := HUNK.match(line)) and current is not None:
            old_start, old_count, new_start, new_count = match.groups()
            old_left = int(old_count) if old_count is not None else 1
            new_left = int(new_count) if new_count is not None else 1
            # An empty side says its start is the line before (0 for an empty file).
            current.pad_to(int(old_start) + (old_left == 0), int(new_start) + (new_left == 0))
        elif line.startswith("Binary files ") and line.endswith(" differ"):
            name = line[len("Binary files ") : -len(" differ")].split(" and ")[-1]
            files.append(FileDiff(name.removeprefix("b/"), note="binary file"))
        elif line.startswith("… [") and files:
            files[-1].note = line.strip("… []")
    return files


def diff_view(path: str, before: str, after: str) -> DiffView:
    return DiffView(path, path, before, after, split=False, annotations=True)


class DiffBlock(VerticalGroup):
    """One or more files' changes."""

    DEFAULT_CSS = """
    DiffBlock { height: auto; margin: 0 0 1 0; }
    DiffBlock > .diff-note { color: $text-muted; }
    """

    def __init__(self, files: list[FileDiff], **kwargs) -> None:
        super().__init__(**kwargs)
        self.files = files

    @classmethod
    def from_texts(cls, path: str, before: str, after: str) -> DiffBlock:
        return cls([FileDiff(path, before.splitlines(), after.splitlines())])

    @classmethod
    def from_unified(cls, text: str) -> DiffBlock | None:
        files = parse_unified_diff(text)
        return cls(files) if files else None

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def compose(self) -> ComposeResult:
        for file in self.files:
            if file.before or file.after:
                yield diff_view(file.path, file.before_text, file.after_text)
            if file.note:
                yield Static(f"{file.path}: {file.note}", classes="diff-note", markup=False)
