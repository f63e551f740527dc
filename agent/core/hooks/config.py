"""Which hooks a session has: the user's hooks.json and the repository's, read and checked.

Two files, both optional:

    <user config dir>/hooks.json        (~/.config/resident on Linux; RESIDENT_CONFIG_DIR)
    <repository>/.resident/hooks.json

    {"hooks": {
        "pre_tool":    [{"matcher": "shell|write", "command": "./check.sh", "timeout": 30}],
        "user_prompt": [{"command": "date +'Today is %A.'", "name": "date"}]
    }}

Events: session_start, user_prompt, pre_tool, post_tool, stop. `matcher` is a
regular expression the whole tool name must match (pre_tool and post_tool
only; absent, "" or "*": every tool). `timeout` is in seconds (default 60,
at most 600). Unknown events and fields are errors: a typo ("pre_tol") must
say so rather than leave a guard that never runs. A file with any problem
costs that file's hooks, all of them (half a set of guards is a surprise;
none, loudly reported, is not); the other file still loads.

Each file is read once, as bytes: the hooks come from those bytes and their
sha256 is what the user trusts (trust.py), so what runs is exactly what was
trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agent.core.mcp.config import user_config_dir
from tools.workspace.bounded_read import MAX_CONFIG_BYTES, RefusedFile, read_bounded

FILE_NAME = "hooks.json"
REPOSITORY_FILE = Path(".resident") / FILE_NAME
EVENTS = ("session_start", "user_prompt", "pre_tool", "post_tool", "stop")
TOOL_EVENTS = frozenset({"pre_tool", "post_tool"})
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 600.0
NAME_CHARS = 40  # a hook without a name is called by the start of its command

HookEventName = Literal["session_start", "user_prompt", "pre_tool", "post_tool", "stop"]
Source = Literal["user", "repository"]


def user_hooks_file() -> Path:
    return user_config_dir() / FILE_NAME


class HookEntry(BaseModel):
    """One hook, as written."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1)
    matcher: str | None = None
    timeout: float = Field(default=DEFAULT_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    name: str | None = Field(default=None, min_length=1, max_length=80)

    @field_validator("command")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("matcher")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is None or value in ("", "*"):
            return None
        try:
            re.compile(value)
        except re.error as err:
            raise ValueError(f"not a valid regular expression ({err})") from None
        return value


class HooksFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hooks: dict[HookEventName, list[HookEntry]] = {}


@dataclass(frozen=True)
class Hook:
    """A hook ready to run: its entry, where it came from, its matcher compiled."""

    event: str
    command: str
    source: Source
    file: Path
    index: int  # its place in the file's list for its event
    timeout: float = DEFAULT_TIMEOUT_S
    matcher: re.Pattern[str] | None = None
    name: str = ""

    def matches(self, tool: str | None) -> bool:
        """Whether it runs for this tool (tool events), or at all (other events)."""
        return self.matcher is None or (
            tool is not None and self.matcher.fullmatch(tool) is not None
        )

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "event": self.event,
            "command": self.command,
            "matcher": self.matcher.pattern if self.matcher is not None else None,
            "timeout": self.timeout,
        }


@dataclass(frozen=True)
class HookFile:
    """One hooks.json that loaded cleanly."""

    path: Path
    source: Source
    digest: str  # sha256 of the file's bytes: what trust is given to
    hooks: tuple[Hook, ...]


@dataclass(frozen=True)
class HookProblem:
    file: Path
    message: str

    def describe(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass
class HooksConfig:
    user: HookFile | None = None
    repository: HookFile | None = None
    problems: list[HookProblem] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No file to run hooks from and nothing to report."""
        return self.user is None and self.repository is None and not self.problems


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _explain(err: ValidationError) -> str:
    parts = []
    for problem in err.errors(include_url=False):
        where = ".".join(str(p) for p in problem["loc"] if p != "[key]")
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field"
        elif problem["type"] == "literal_error" and problem["loc"][-1] == "[key]":
            message = f"unknown event; the events are {', '.join(EVENTS)}"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def parse_hooks(data: bytes, path: Path, source: Source) -> HookFile | HookProblem:
    """A hooks file's bytes as hooks, or the problem that makes the whole file unusable."""
    try:
        text = data.decode("utf-8")
        raw = json.loads(text) if text.strip() else {}
    except UnicodeDecodeError as err:
        return HookProblem(path, f"not UTF-8 text ({err})")
    except json.JSONDecodeError as err:
        return HookProblem(
            path, f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        )
    except RecursionError:
        return HookProblem(path, "not usable: its JSON is nested too deeply")
    if not isinstance(raw, dict):
        return HookProblem(path, f"must hold a JSON object, not {type(raw).__name__}")
    try:
        parsed = HooksFile.model_validate(raw)
    except ValidationError as err:
        return HookProblem(path, _explain(err))
    hooks: list[Hook] = []
    for event in EVENTS:  # a fixed order, whatever the file's
        for index, entry in enumerate(parsed.hooks.get(event, [])):  # type: ignore[call-overload]
            if entry.matcher is not None and event not in TOOL_EVENTS:
                return HookProblem(
                    path,
                    f"hooks.{event}.{index}.matcher: only pre_tool and post_tool hooks match tools",
                )
            hooks.append(
                Hook(
                    event=event,
                    command=entry.command,
                    source=source,
                    file=path,
                    index=index,
                    timeout=entry.timeout,
                    matcher=re.compile(entry.matcher) if entry.matcher is not None else None,
                    name=entry.name or _short(entry.command),
                )
            )
    return HookFile(path, source, digest(data), tuple(hooks))


def _short(command: str) -> str:
    line = " ".join(command.split())
    return line if len(line) <= NAME_CHARS else line[: NAME_CHARS - 1] + "…"


def read_hooks_file(path: Path, source: Source) -> HookFile | HookProblem | None:
    """None when there is no such file."""
    try:
        # Bounded: a hooks.json that is a link to /dev/zero or a FIFO must not hang start-up.
        data = read_bounded(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except RefusedFile as err:
        return HookProblem(path, f"not read: it {err.reason}")
    except OSError as err:
        return HookProblem(path, f"cannot read it: {err}")
    return parse_hooks(data, path, source)


def load_hooks(workspace: Path, user_file: Path | None = None) -> HooksConfig:
    """The hooks declared for `workspace`, and every problem found on the way."""
    user_file = user_file or user_hooks_file()
    repo_file = Path(os.path.realpath(workspace)) / REPOSITORY_FILE
    config = HooksConfig()
    user = read_hooks_file(user_file, "user")
    # A workspace that is the config dir's parent holds the user's own file: read it once.
    same = os.path.realpath(repo_file) == os.path.realpath(user_file)
    repo = None if same else read_hooks_file(repo_file, "repository")
    for loaded in (user, repo):
        if isinstance(loaded, HookProblem):
            config.problems.append(loaded)
    config.user = user if isinstance(user, HookFile) else None
    config.repository = repo if isinstance(repo, HookFile) else None
    return config
