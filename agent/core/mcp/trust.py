"""Which of a repository's MCP servers the user trusted: per repository, per server, by content.

A repository's `.resident/mcp.json` is code the repository ships: a stdio
entry names a program to start, an HTTP entry a place to send requests.
None of its servers starts until the person has trusted it with
`resident mcp trust NAME` in that repository, which records, in the user's
config dir:

    <user config dir>/trusted-mcp.json
    {"version": 1, "repositories": {"/home/me/src/app": {"servers": {"lint": {
        "sha256": "...", "files": {"tools/lint_server.py": "<sha256>"}, "trusted_at": "..."}}}}}

The digest covers the server's entry as written (its name, command, args,
env, URL, headers, grants) and every file inside the workspace the entry
names (agent/core/repository_trust.py), keyed by the repository's real
path: the same server name in another repository is another server, and a
changed entry or script is no longer trusted. The record lives in the
config dir, which no tool the model drives may write, wherever the
workspace lies (tools.workspace.protected). A record that cannot be read
trusts nothing (fail closed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from agent.core.repository_trust import Coverage, cover
from tools.workspace.bounded_read import MAX_CONFIG_BYTES, read_bounded_text

TRUST_FILE = "trusted-mcp.json"
TRUST_COMMAND = "resident mcp trust"
VERSION = 1

TrustState = Literal["trusted", "untrusted", "changed"]

log = logging.getLogger(__name__)


def entry_words(raw: Mapping[str, Any]) -> list[str]:
    """The words of an entry that can name a file it runs: the program, its arguments,
    and its environment's values (`NODE_OPTIONS=--require ./x.js` runs x.js)."""
    words: list[str] = [raw["command"]] if isinstance(raw.get("command"), str) else []
    for value in raw.get("args") or []:
        if isinstance(value, str):
            words.append(value)
    env = raw.get("env")
    if isinstance(env, dict):
        for value in env.values():
            if isinstance(value, str):
                words.extend(value.split())
    return words


def server_coverage(name: str, raw: Mapping[str, Any], workspace: Path) -> Coverage:
    """A repository server's entry (as written) and the workspace files it names, now."""
    text = json.dumps({"name": name, "entry": raw}, sort_keys=True, ensure_ascii=False)
    entry_digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
    return cover(entry_digest, entry_words(raw), workspace)


def _key(workspace: Path) -> str:
    return os.path.realpath(workspace)


class McpTrust:
    """The user's trust in repository servers, kept at `path` (config.py's `mcp_trust()`:
    TRUST_FILE in the user's config dir); every call reads the file anew (the CLI may
    have changed it since), and writes replace it atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(read_bounded_text(self.path, MAX_CONFIG_BYTES))
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
            log.warning("cannot read %s (no repository server is trusted): %s", self.path, err)
            return {}
        repositories = data.get("repositories") if isinstance(data, dict) else None
        if not isinstance(repositories, dict):
            return {}
        return {k: v for k, v in repositories.items() if isinstance(v, dict)}

    def _servers(self, records: dict[str, dict[str, Any]], workspace: Path) -> dict[str, Any]:
        servers = records.get(_key(workspace), {}).get("servers")
        return servers if isinstance(servers, dict) else {}

    def record(self, workspace: Path, name: str) -> dict[str, Any] | None:
        found = self._servers(self.records(), workspace).get(name)
        return found if isinstance(found, dict) else None

    def state(self, workspace: Path, name: str, digest: str) -> TrustState:
        record = self.record(workspace, name)
        if record is None:
            return "untrusted"
        return "trusted" if record.get("sha256") == digest else "changed"

    def trusted_files(self, workspace: Path, name: str) -> dict[str, str] | None:
        files = (self.record(workspace, name) or {}).get("files")
        return files if isinstance(files, dict) else None

    def trust(self, workspace: Path, covered: Mapping[str, Coverage]) -> None:
        """Trust these servers of the repository, as they are now."""
        records = self.records()
        servers = dict(self._servers(records, workspace))
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        for name, coverage in covered.items():
            servers[name] = {
                "sha256": coverage.digest,
                "files": dict(coverage.files),
                "trusted_at": when,
            }
        records[_key(workspace)] = {"servers": servers}
        self._write(records)

    def untrust(self, workspace: Path, names: Iterable[str] | None = None) -> list[str]:
        """Take trust back (every server of the repository when `names` is None); the
        names that were trusted."""
        records = self.records()
        servers = dict(self._servers(records, workspace))
        chosen = list(servers) if names is None else [n for n in names if n in servers]
        if not chosen:
            return []
        for name in chosen:
            del servers[name]
        if servers:
            records[_key(workspace)] = {"servers": servers}
        else:
            records.pop(_key(workspace), None)
        self._write(records)
        return sorted(chosen)

    def _write(self, records: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"version": VERSION, "repositories": records}, indent=2, sort_keys=True)
        fd, temp = tempfile.mkstemp(prefix=".trusted-mcp-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
            os.chmod(temp, 0o600)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
