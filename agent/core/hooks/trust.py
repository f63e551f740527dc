"""Which repositories' hooks the user has trusted, and with which content.

A repository's `.resident/hooks.json` is code the repository ships: anyone
who can get a file into a clone could otherwise run commands the moment
Resident opens it. Its hooks run only once the user has trusted them with
`resident hooks trust`, which records the repository's real path and the
sha256 of the hooks file's bytes in the user's config dir:

    <user config dir>/trusted-hooks.json
    {"version": 1, "repositories": {"/home/me/src/app": {"sha256": "...", "trusted_at": "..."}}}

A changed file (another digest) is no longer trusted; a moved or re-cloned
repository (another path) is not either. The record lives outside every
workspace and outside what sandboxed commands can see, so neither a model's
commands nor a repository's hooks can trust themselves. A record that cannot
be read trusts nothing (fail closed).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from agent.core.mcp.config import user_config_dir

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
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
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

    def trust(self, workspace: Path, digest: str) -> None:
        records = self.records()
        records[_key(workspace)] = {
            "sha256": digest,
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
