"""The vocabulary of approvals: modes, verdicts, decisions and the rules users write."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from enum import Enum

from tools.sandbox.grants import READ_ONLY, SandboxGrant
from tools.workspace.ignore import IgnoreMatcher, parse_rule
from tools.workspace.paths import ResolvedPath

NAMESPACE_SEPARATOR = "__"  # between the parts of a namespaced tool name


class ApprovalMode(str, Enum):
    """How tool calls are approved. The values are the ids people type and clients
    see (`--approval`, `/approval`, ACP's session modes); every front end lists and
    parses modes through this class, so a mode added here shows up everywhere."""

    READ_ONLY = "read-only"
    PLAN = "plan"  # read-only exploration, then a plan the user approves before any change
    ASK = "ask"
    AUTO_EDIT = "auto-edit"
    FULL_AUTO = "full-auto"

    @classmethod
    def parse(cls, text: str) -> ApprovalMode:
        """The mode `text` names, the one way text becomes a mode: case, spaces
        around it and `_` for `-` do not matter ("Full_Auto"). ValueError names
        the modes, in words fit to show the person who typed it."""
        if isinstance(text, cls):
            return text
        key = str(text).strip().lower().replace("_", "-")
        for mode in cls:
            if mode.value == key:
                return mode
        raise ValueError(f"unknown approval mode {text!r}; the modes are {', '.join(cls.ids())}")

    @classmethod
    def ids(cls) -> tuple[str, ...]:
        """Every mode's id, in order from the strictest: the choices shown to people."""
        return tuple(mode.value for mode in cls)

    @property
    def read_only(self) -> bool:
        """Tools are judged as in read-only mode: reads, read-only commands in a read-only
        sandbox, nothing else. The one test the policy makes, so plan mode can never
        drift looser than read-only."""
        return self in (ApprovalMode.READ_ONLY, ApprovalMode.PLAN)

    @property
    def label(self) -> str:
        """A short name for pickers (an editor's mode menu)."""
        return _ABOUT[self][0]

    @property
    def description(self) -> str:
        """What the mode lets the agent do without asking, in one sentence."""
        return _ABOUT[self][1]


# Named and described once, beside the modes: a mode without an entry fails loudly.
_ABOUT: dict[ApprovalMode, tuple[str, str]] = {
    ApprovalMode.READ_ONLY: ("Read-only", "Reads only; no edits or commands."),
    ApprovalMode.PLAN: (
        "Plan",
        "Explores read-only, then proposes a plan to approve before any change.",
    ),
    ApprovalMode.ASK: ("Ask", "Asks before every edit and command."),
    ApprovalMode.AUTO_EDIT: ("Auto-edit", "Edits without asking; asks before commands."),
    ApprovalMode.FULL_AUTO: (
        "Full auto",
        "Edits and runs commands (in the sandbox) without asking.",
    ),
}


class Verdict(str, Enum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    request: str  # what the call would do, in words a person can approve
    # What the sandbox lets the call do if it runs (after approval, for ASK).
    grant: SandboxGrant = READ_ONLY
    # ASK for this very call only: a change to Resident's configuration, which no
    # "allow for this session" answer may cover (tools.permissions.config_zone).
    once: bool = False

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW

    @property
    def needs_approval(self) -> bool:
        return self.verdict is Verdict.ASK

    @property
    def denied(self) -> bool:
        return self.verdict is Verdict.DENY


@dataclass(frozen=True)
class Rule:
    """`tool` is a tool name or '*'; `pattern` is a command prefix for shell
    ("git push") or a path glob for file tools ("src/**", ".env"), None for all.

    Namespaced tools (`mcp__SERVER__TOOL`) are covered by a rule naming the
    tool or any namespace above it: `mcp__SERVER` (one server), `mcp` (all)."""

    tool: str
    pattern: str | None = None

    @classmethod
    def parse(cls, text: str) -> Rule:
        """'shell', 'shell:npm test', 'shell(npm test)', 'write:src/**', '*'."""
        text = text.strip()
        match = re.fullmatch(r"([\w*-]+)\((.*)\)", text)
        if match:
            return cls(match.group(1), match.group(2).strip() or None)
        tool, _, pattern = text.partition(":")
        return cls(tool.strip(), pattern.strip() or None)

    def __str__(self) -> str:
        return self.tool if self.pattern is None else f"{self.tool}:{self.pattern}"

    def covers_tool(self, name: str) -> bool:
        return self.tool in ("*", name) or self.names_namespace_of(name)

    def names_namespace_of(self, name: str) -> bool:
        return name.startswith(self.tool + NAMESPACE_SEPARATOR)

    def names_tool(self, name: str) -> bool:
        """Covers `name` by naming it or its namespace: '*' is not enough."""
        return self.tool == name or self.names_namespace_of(name)

    def prefix_tokens(self) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(self.pattern or ""))
        except ValueError:
            return tuple((self.pattern or "").split())

    def matches_path(self, path: ResolvedPath) -> bool:
        rule = parse_rule(self.pattern or "")
        return rule is not None and IgnoreMatcher([rule]).is_ignored(path.relative.as_posix())
