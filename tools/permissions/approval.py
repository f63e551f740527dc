"""The vocabulary of approvals: modes, verdicts, decisions and the rules users write."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from enum import Enum

from tools.sandbox.bubblewrap import READ_ONLY, SandboxGrant
from tools.workspace.ignore import IgnoreMatcher, parse_rule
from tools.workspace.paths import ResolvedPath

NAMESPACE_SEPARATOR = "__"  # between the parts of a namespaced tool name


class ApprovalMode(str, Enum):
    READ_ONLY = "read-only"
    ASK = "ask"
    AUTO_EDIT = "auto-edit"
    FULL_AUTO = "full-auto"


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
