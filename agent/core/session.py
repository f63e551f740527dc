"""Sessions on disk: every event journaled, the conversation kept for `--resume`.

A session is a folder under the data directory (platformdirs' user data dir,
or `RESIDENT_DATA_DIR`): `meta.json`, `events.jsonl` (every event, appended
as it happens) and `messages.jsonl` (the conversation, appended only when a
turn completes). Both files are flushed and synced at turn ends, so a
process killed mid-turn loses at most that partial turn; a torn last line
from a kill is left out on load and cut off before the next append, with a
warning (agent/core/journal.py).
Text that is not valid Unicode (a lone surrogate) is written as U+FFFD
(agent/core/valid_unicode.py), so no line is ever lost to it.

`messages.jsonl` is a log of operations: `append` adds messages, `reset`
replaces the whole conversation (compaction, undo).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import platformdirs

from agent.core.events import Event, SessionCompleted, TurnCompleted, parse_event
from agent.core.journal import open_for_append, read_records
from agent.core.valid_unicode import json_text, model_json, valid_text

DATA_DIR_ENV = "RESIDENT_DATA_DIR"


def data_dir() -> Path:
    override = os.environ.get(DATA_DIR_ENV)
    return Path(override) if override else Path(platformdirs.user_data_dir("resident"))


class SessionNotFound(LookupError):
    pass


@dataclass
class SessionMeta:
    id: str
    workspace: str
    model: str
    created_at: float
    updated_at: float
    title: str = ""

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.updated_at).strftime("%Y-%m-%d %H:%M")
        return f"{self.id}  {when}  {self.model}  {self.title}"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [record for record in read_records(path) if isinstance(record, dict)]


def _sync(handle: IO[str]) -> None:
    handle.flush()
    os.fsync(handle.fileno())


class Session:
    def __init__(self, directory: Path, meta: SessionMeta) -> None:
        self.dir = directory
        self.meta = meta
        self._events: IO[str] | None = None
        self._messages: IO[str] | None = None

    @property
    def id(self) -> str:
        return self.meta.id

    # -- writing -------------------------------------------------------------

    def journal(self, event: Event) -> None:
        """An event sink: append now, make durable at turn and session ends."""
        if self._events is None:
            self._events = open_for_append(self.dir / "events.jsonl")
        self._events.write(model_json(event) + "\n")
        if isinstance(event, TurnCompleted | SessionCompleted):
            self.flush()

    def append_messages(self, messages: list[dict[str, Any]]) -> None:
        self._write_messages({"op": "append", "messages": messages})

    def reset_messages(self, messages: list[dict[str, Any]]) -> None:
        self._write_messages({"op": "reset", "messages": messages})

    def _write_messages(self, record: dict[str, Any]) -> None:
        if self._messages is None:
            self._messages = open_for_append(self.dir / "messages.jsonl")
        self._messages.write(json_text(record) + "\n")
        _sync(self._messages)

    def set_title(self, title: str) -> None:
        if not self.meta.title:
            self.meta.title = valid_text(" ".join(title.split())[:80])
            self._save_meta()

    def flush(self) -> None:
        if self._events is not None:
            _sync(self._events)
        self.meta.updated_at = time.time()
        self._save_meta()

    def _save_meta(self) -> None:
        temp = self.dir / "meta.json.tmp"
        temp.write_text(json.dumps(asdict(self.meta), indent=2), encoding="utf-8")
        os.replace(temp, self.dir / "meta.json")

    def close(self) -> None:
        self.flush()
        for handle in (self._events, self._messages):
            if handle is not None:
                handle.close()
        self._events = self._messages = None

    # -- reading -------------------------------------------------------------

    def load_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for record in _read_jsonl(self.dir / "messages.jsonl"):
            if record.get("op") == "reset":
                messages = list(record.get("messages") or [])
            elif record.get("op") == "append":
                messages.extend(record.get("messages") or [])
        return messages

    def load_events(self) -> list[Event]:
        events = []
        for record in _read_jsonl(self.dir / "events.jsonl"):
            try:
                events.append(parse_event(record))
            except ValueError:
                continue
        return events

    def next_seq(self) -> int:
        events = self.load_events()
        return events[-1].seq + 1 if events else 1


class SessionStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or data_dir()) / "sessions"

    def create(self, workspace: Path, model: str, title: str = "") -> Session:
        self.root.mkdir(parents=True, exist_ok=True)
        now = time.time()
        session_id = datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        directory = self.root / session_id
        directory.mkdir()
        meta = SessionMeta(session_id, str(workspace), model, now, now)
        session = Session(directory, meta)
        session.set_title(title)
        session._save_meta()
        return session

    def open(self, session_id: str) -> Session:
        directory = self.root / session_id
        meta_file = directory / "meta.json"
        if "/" in session_id or not meta_file.is_file():
            matches = [m for m in self.list() if m.id.startswith(session_id)] if session_id else []
            if len(matches) == 1:
                return self.open(matches[0].id)
            raise SessionNotFound(
                f"no session {session_id!r}; `resident sessions` lists them"
                + (f" ({len(matches)} match that prefix)" if matches else "")
            )
        meta = SessionMeta(**json.loads(meta_file.read_text(encoding="utf-8")))
        return Session(directory, meta)

    def list(self, workspace: Path | None = None) -> list[SessionMeta]:
        """Sessions, most recently used first; only those of `workspace` when given."""
        metas = []
        if not self.root.is_dir():
            return metas
        for meta_file in self.root.glob("*/meta.json"):
            try:
                meta = SessionMeta(**json.loads(meta_file.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                continue
            if workspace is None or meta.workspace == str(workspace):
                metas.append(meta)
        return sorted(metas, key=lambda m: (m.updated_at, m.id), reverse=True)

    def latest(self, workspace: Path) -> Session | None:
        metas = self.list(workspace)
        return self.open(metas[0].id) if metas else None
