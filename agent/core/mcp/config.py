"""Which MCP servers a session has: the user's file and the repository's, read and checked.

Two files, in the shape Claude Code and Cursor use, so a file written for
them mostly works here:

    ~/.config/resident/mcp.json      (platformdirs' user config dir, or RESIDENT_CONFIG_DIR)
    <repository>/.resident/mcp.json

    {"mcpServers": {
        "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                   "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}, "network": true},
        "docs":   {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${T}"}}
    }}

A repository's entry never replaces (or disables) the user's server of the
same name, nor of a name that reads the same in tool names (`mcp__NAME`):
it is refused with a message, so the user's `--allow mcp__NAME` rules only
ever reach the user's own server. A broken file costs that file's servers,
a broken entry costs that server; each problem names the file and the
field, and the rest still loads.

Trust: a repository's file is code the repository ships, so none of its
servers starts until the user trusted it in this repository, as it is now
(`resident mcp trust NAME`: its entry and the workspace files it names, by
digest, under the repository's real path; trust.py). A trusted one is
treated as the user's own for its grants and `${VAR}`, but like a
repository's hooks it runs only in the sandbox. An untrusted or changed one
carries no grants and no expansion (a hostile file could otherwise send the
user's tokens to its own URL), and launch.py refuses to start it, saying
how to trust it. The old `"trustedRepositoryServers"` (a name, trusted in every
repository) is no longer honoured, and says so.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.core.mcp.names import server_part
from agent.core.mcp.trust import TRUST_COMMAND, TRUST_FILE, McpTrust, server_coverage
from agent.core.repository_trust import Coverage
from tools.workspace.bounded_read import MAX_CONFIG_BYTES, RefusedFile, read_bounded_text

CONFIG_DIR_ENV = "RESIDENT_CONFIG_DIR"
FILE_NAME = "mcp.json"
REPOSITORY_FILE = Path(".resident") / FILE_NAME
DEFAULT_STARTUP_TIMEOUT_S = 30.0
DEFAULT_TOOL_TIMEOUT_S = 120.0
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def user_config_dir() -> Path:
    override = os.environ.get(CONFIG_DIR_ENV)
    return Path(override) if override else Path(platformdirs.user_config_dir("resident"))


def user_config_file() -> Path:
    return user_config_dir() / FILE_NAME


def mcp_trust() -> McpTrust:
    """The user's records of trusted repository servers."""
    return McpTrust(user_config_dir() / TRUST_FILE)


class ServerEntry(BaseModel):
    """One entry of `mcpServers`, as written. Unknown keys are an error: a typo
    ("comand") should say so rather than leave a server that never starts."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["stdio", "http", "streamable-http", "streamableHttp"] | None = None
    command: str | None = Field(default=None, min_length=1)
    args: list[str] = []
    env: dict[str, str] = {}
    url: str | None = Field(default=None, min_length=1)
    headers: dict[str, str] = {}
    # What the sandbox grants a stdio server beyond a read-only workspace.
    network: bool = False
    write: bool = False
    read: list[str] = []
    startup_timeout: float = Field(default=DEFAULT_STARTUP_TIMEOUT_S, gt=0, alias="startupTimeout")
    tool_timeout: float = Field(default=DEFAULT_TOOL_TIMEOUT_S, gt=0, alias="toolTimeout")
    disabled: bool = False

    @model_validator(mode="after")
    def _one_transport(self) -> ServerEntry:
        if self.command is None and self.url is None:
            raise ValueError('needs "command" (a stdio server) or "url" (streamable HTTP)')
        if self.command is not None and self.url is not None:
            raise ValueError('give "command" (stdio) or "url" (streamable HTTP), not both')
        if self.type == "stdio" and self.command is None:
            raise ValueError('"type": "stdio" needs "command"')
        if self.type not in (None, "stdio") and self.url is None:
            raise ValueError(f'"type": "{self.type}" needs "url"')
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f'"url" must start with http:// or https:// (got {self.url!r})')
        return self


class ConfigFile(BaseModel):
    model_config = ConfigDict(extra="allow")  # other tools' settings may share the file

    mcp_servers: dict[str, Any] = Field(default={}, alias="mcpServers")
    trusted: list[str] = Field(default=[], alias="trustedRepositoryServers")


@dataclass(frozen=True)
class ConfigProblem:
    file: Path
    message: str
    server: str | None = None  # None: not one server's failure (a file, a setting, a clash)

    def describe(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass(frozen=True)
class ServerConfig:
    """A server ready to start: its entry resolved (variables expanded, trust applied)."""

    name: str
    source: Literal["user", "repository"]
    file: Path
    transport: Literal["stdio", "http"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    network: bool = False
    write: bool = False
    read: tuple[Path, ...] = ()
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S
    tool_timeout: float = DEFAULT_TOOL_TIMEOUT_S
    trusted: bool = True  # the user's own entry, or a repository entry the user trusts
    notes: tuple[str, ...] = ()  # what of the entry was not honoured, and why
    # A repository's entry: whether the user trusted it as it is ("trusted"), never did,
    # or did before it or a file it names changed (`changed` names them); what was
    # covered, to check again right before it starts. The user's own: "own".
    trust_state: Literal["own", "trusted", "untrusted", "changed"] = "own"
    coverage: Coverage | None = None
    changed: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        """What it runs or reaches, for a person (no header values: they hold tokens)."""
        if self.transport == "http":
            return self.url or ""
        return " ".join([self.command or "", *self.args]).strip()


@dataclass
class McpConfig:
    servers: dict[str, ServerConfig] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # the files that exist, user first


Lookup = Callable[[str], str | None]


def expand(text: str, lookup: Lookup) -> str:
    """`${VAR}` and `${VAR:-default}`; an unset variable without a default becomes ""."""

    def one(match: re.Match[str]) -> str:
        value = lookup(match.group(1))
        if value is None:
            return match.group(2) or ""
        return value

    return _VARIABLE.sub(one, text)


def _read(path: Path) -> tuple[ConfigFile | None, ConfigProblem | None]:
    try:
        # Bounded: an mcp.json that is a link to /dev/zero or a FIFO must not hang start-up.
        text = read_bounded_text(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None, None
    except RefusedFile as err:
        return None, ConfigProblem(path, f"not read: it {err.reason}")
    except (OSError, UnicodeDecodeError) as err:
        return None, ConfigProblem(path, f"cannot read it: {err}")
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as err:
        return None, ConfigProblem(
            path, f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        )
    except RecursionError:
        return None, ConfigProblem(path, "not usable: its JSON is nested too deeply")
    if not isinstance(data, dict):
        return None, ConfigProblem(path, f"must hold a JSON object, not {type(data).__name__}")
    try:
        return ConfigFile.model_validate(data), None
    except ValidationError as err:
        return None, ConfigProblem(path, _explain(err, ""))


def read_config_file(path: Path) -> tuple[ConfigFile | None, ConfigProblem | None]:
    """One mcp.json, parsed; (None, None) when it does not exist."""
    return _read(path)


def _explain(err: ValidationError, prefix: str) -> str:
    parts = []
    for problem in err.errors(include_url=False):
        where = ".".join(str(p) for p in (prefix, *problem["loc"]) if p != "")
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _resolve(
    name: str,
    entry: ServerEntry,
    source: Literal["user", "repository"],
    path: Path,
    workspace: Path,
    trusted: bool,
    lookup: Lookup,
) -> ServerConfig:
    notes: list[str] = []
    if trusted:
        sub = lambda text: expand(text, lookup)  # noqa: E731
    else:
        sub = lambda text: text  # noqa: E731
        refused = [g for g in ("network", "write", "read") if getattr(entry, g)]
        if refused:
            notes.append(
                f"{', '.join(refused)} not granted: the repository's file asked for it, and "
                f"you have not trusted this server here (`{TRUST_COMMAND} {name}`)"
            )
    read = tuple(Path(os.path.expanduser(sub(p))) for p in entry.read) if trusted else ()
    return ServerConfig(
        name=name,
        source=source,
        file=path,
        transport="stdio" if entry.command is not None else "http",
        command=sub(entry.command) if entry.command is not None else None,
        args=tuple(sub(a) for a in entry.args),
        env={k: sub(v) for k, v in entry.env.items()},
        url=sub(entry.url) if entry.url is not None else None,
        headers={k: sub(v) for k, v in entry.headers.items()},
        network=entry.network and trusted,
        write=entry.write and trusted,
        read=tuple(p if p.is_absolute() else workspace / p for p in read),
        startup_timeout=entry.startup_timeout,
        tool_timeout=entry.tool_timeout,
        trusted=trusted,
        notes=tuple(notes),
    )


def load_config(
    workspace: Path,
    user_file: Path | None = None,
    lookup: Lookup | None = None,
    trust: McpTrust | None = None,
) -> McpConfig:
    """The servers declared for `workspace`, and every problem found on the way."""
    from agent.core.process_guard import withheld_variable

    lookup = lookup or (lambda name: os.environ.get(name) or withheld_variable(name))
    trust = trust if trust is not None else mcp_trust()
    user_file = user_file or user_config_file()
    repo_file = workspace / REPOSITORY_FILE
    config = McpConfig()
    user, problem = _read(user_file)
    if problem:
        config.problems.append(problem)
    repo, problem = (None, None) if repo_file == user_file else _read(repo_file)
    if problem:
        config.problems.append(problem)
    if user is not None and user.trusted:
        config.problems.append(ConfigProblem(user_file, LEGACY_TRUST))
    # Every name the user declared, broken or disabled entries included: the repository's
    # file may not take it over (nor the allow rules written for it).
    taken = {server_part(n) for n in user.mcp_servers} if user is not None else set()
    for source, path, parsed in (("user", user_file, user), ("repository", repo_file, repo)):
        if parsed is None:
            continue
        config.files.append(path)
        for name, raw in parsed.mcp_servers.items():
            where = f"mcpServers.{name}"
            if source == "repository" and server_part(name) in taken:
                config.problems.append(ConfigProblem(path, _clash(where, name, user_file)))
                continue
            try:
                entry = ServerEntry.model_validate(raw if isinstance(raw, dict) else {"": raw})
            except ValidationError as err:
                if not isinstance(raw, dict):
                    message = f"{where}: must be an object with command or url"
                else:
                    message = _explain(err, where)
                config.problems.append(ConfigProblem(path, message, server=name))
                config.servers.pop(name, None)  # a broken override must not revive the other
                continue
            if entry.disabled:
                config.servers.pop(name, None)
                continue
            state, coverage, changed = "own", None, ()
            if source == "repository":
                coverage = server_coverage(name, raw, workspace)
                state = trust.state(workspace, name, coverage.digest)
                if state == "changed":
                    changed = tuple(coverage.changed_since(trust.trusted_files(workspace, name)))
            resolved = _resolve(
                name,
                entry,
                source,
                path,
                workspace,
                state in ("own", "trusted"),
                lookup,  # type: ignore[arg-type]
            )
            config.servers[name] = replace(
                resolved, trust_state=state, coverage=coverage, changed=changed
            )
    return config


LEGACY_TRUST = (
    '"trustedRepositoryServers" is no longer honoured: it trusted a server name in every '
    f"repository. Run `{TRUST_COMMAND} NAME` in a repository instead: it trusts that "
    "server's entry and the files it runs, there only"
)


def _clash(where: str, name: str, user_file: Path) -> str:
    return (
        f"{where}: not started: your {user_file} already declares a server named {name!r} "
        "(or one whose tools read the same). A repository's server never replaces yours, nor "
        "gets the allow rules you wrote for it; rename it in this file to use it"
    )
