"""What the user sent before, for ↑ and ↓ in the input box; kept across runs.

One JSON string per line in the data directory, the newest last, at most
`limit` entries.
"""

from __future__ import annotations

from pathlib import Path

from agent.core.journal import open_for_append, read_records
from agent.core.session import data_dir
from agent.core.valid_unicode import json_text

HISTORY_FILE = "prompt_history.jsonl"


class PromptHistory:
    def __init__(self, path: Path | None = None, limit: int = 500) -> None:
        self.path = path if path is not None else data_dir() / HISTORY_FILE
        self.limit = limit
        self.entries: list[str] = self._load()
        self._index = len(self.entries)  # len(entries): the draft being written
        self._draft = ""

    def _load(self) -> list[str]:
        try:  # torn or undecodable lines (a kill mid-append) are left out, never fatal
            values = read_records(self.path)
        except OSError:
            return []
        return [value for value in values if isinstance(value, str)][-self.limit :]

    def add(self, text: str) -> None:
        self._index = len(self.entries)
        if not text.strip() or (self.entries and self.entries[-1] == text):
            self._index = len(self.entries)
            return
        self.entries.append(text)
        self.entries = self.entries[-self.limit :]
        self._index = len(self.entries)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open_for_append(self.path) as handle:
                handle.write(json_text(text) + "\n")
        except OSError:
            pass  # history is a convenience; never fail a message over it

    def previous(self, draft: str) -> str | None:
        """The entry before the current one; None at the oldest."""
        if self._index == len(self.entries):
            self._draft = draft
        if self._index == 0:
            return None
        self._index -= 1
        return self.entries[self._index]

    def next(self) -> str | None:
        """The entry after the current one, the draft after the newest; None past it."""
        if self._index >= len(self.entries):
            return None
        self._index += 1
        return self._draft if self._index == len(self.entries) else self.entries[self._index]
