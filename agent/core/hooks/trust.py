"""Which repositories' hooks the user has trusted, and with which content.

A repository's `.resident/hooks.json` is code the repository ships: anyone
who can get a file into a clone could otherwise run commands the moment
Resident opens it. Its hooks run only once the user has trusted them with
`resident hooks trust`, which records the repository's real path and one
digest of the hooks file's bytes and of every workspace file its commands
name (agent/core/repository_trust.py: `./scripts/guard.sh` is covered, not
just the line naming it) in the user's config dir:

    <user config dir>/trusted-hooks.json
    {"version": 1, "repositories": {"/home/me/src/app": {"sha256": "...",
        "files": {"scripts/guard.sh": "<sha256>"}, "trusted_at": "..."}}}

A changed file or script (another digest) is no longer trusted; a moved or
re-cloned repository (another path) is not either. `files` only says which
script changed. The record lives in the config dir, which no tool the model
drives may write (tools.workspace.protected), wherever the workspace is, and
which sandboxed commands find read-only, so neither a model nor a
repository's hooks can trust themselves. A record that cannot be read
trusts nothing (fail closed).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from agent.core.mcp.config import user_config_dir
from tools.workspace.bounded_read import MAX_CONFIG_BYTES, read_bounded_text

TRUST_FILE = "trusted-hooks.json"
VERSION = 1

TrustState = Literal["trusted", "untrusted", "changed"]

log = logging.getLogger(__name__)


def trust_file() -> Path:
    return user_config_dir() / TRUST_FILE


def _key(workspace: Path) -> str:
    return os.path.realpath(workspace)


class HookTrust:
    """The user's trust records; every call reads the file anew (the CLI may have
    changed it since), and writes replace it atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or trust_file()

    def records(self) -> dict[str, dict[str, Any]]:
        try:
            # Bounded, like every file Resident reads on its own (a FIFO must not hang it).
            data = json.loads(read_bounded_text(self.path, MAX_CONFIG_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
            log.warning("cannot read %s (nothing is trusted): %s", self.path, err)
            return {}
        repositories = data.get("repositories") if isinstance(data, dict) else None
        if not isinstance(repositories, dict):
            return {}
        return {k: v for k, v in repositories.items() if isinstance(v, dict)}

    def state(self, workspace: Path, digest: str) -> TrustState:
        record = self.records().get(_key(workspace))
        if record is None:
            return "untrusted"
        return "trusted" if record.get("sha256") == digest else "changed"

    def is_trusted(self, workspace: Path, digest: str) -> bool:
        return self.state(workspace, digest) == "trusted"

    def trusted_files(self, workspace: Path) -> dict[str, str] | None:
        """What the named files held when trusted (None: no record, or one without)."""
        files = self.records().get(_key(workspace), {}).get("files")
        return files if isinstance(files, dict) else None

    def trust(self, workspace: Path, digest: str, files: Mapping[str, str] | None = None) -> None:
        records = self.records()
        records[_key(workspace)] = {
            "sha256": digest,
            "files": dict(files or {}),
            "trusted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self._write(records)

    def untrust(self, workspace: Path) -> bool:
        """False when there was nothing to take back."""
        records = self.records()
        if records.pop(_key(workspace), None) is None:
            return False
        self._write(records)
        return True

    def _write(self, records: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": VERSION, "repositories": records}, indent=2, sort_keys=True)
        fd, temp = tempfile.mkstemp(prefix=".trusted-hooks-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
            os.chmod(temp, 0o600)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
