"""The approval policy: for each tool call, allow it, ask a person, or deny it.

Order of judgement, first match wins:
1. paths: every path is resolved through symlinks; outside the workspace
   (and the extra roots the user allowed) is denied in every mode; file
   tools never write inside .git;
2. deny rules (by tool, by command prefix, by path glob); for shell commands
   a deny rule matches any command the line would run, through `;`, `&&`,
   pipes, substitutions, `sh -c`, `eval`, `xargs`, `sudo`, `find -exec` and
   the like; a line the checker cannot see through asks instead;
3. the mode, where allow rules can lift an "ask" to "allow" (never past
   read-only): reads are allowed, except secrets and .git internals, which
   ask; writes are denied in read-only, asked in ask mode, allowed in
   auto-edit and full-auto; shell commands that only read are allowed
   everywhere, other commands are denied in read-only, asked in ask and
   auto-edit, allowed in full-auto.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from tools.base import Effect, ToolAccess, ToolCall
from tools.context import ToolContext
from tools.ignore import IgnoreMatcher, parse_rule
from tools.paths import PathError, ResolvedPath, resolve_path, sensitivity
from tools.readonly_commands import path_operands, read_only_problem
from tools.shell_parse import CommandAnalysis, SimpleCommand, analyze, command_positions

SHELL_TOOL = "shell"
# Variables that change which program runs or what it loads.
_DANGEROUS_ASSIGNMENT = re.compile(
    r"^(PATH|IFS|ENV|BASH_ENV|PS4|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|PYTHONPATH|PYTHONSTARTUP|"
    r"NODE_OPTIONS|PERL5OPT|RUBYOPT|LD_\w*|DYLD_\w*|GIT_\w*)="
)


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
    ("git push") or a path glob for file tools ("src/**", ".env"), None for all."""

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
        return self.tool in ("*", name)

    def prefix_tokens(self) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(self.pattern or ""))
        except ValueError:
            return tuple((self.pattern or "").split())

    def matches_path(self, path: ResolvedPath) -> bool:
        rule = parse_rule(self.pattern or "")
        return rule is not None and IgnoreMatcher([rule]).is_ignored(path.relative.as_posix())


def _program_matches(word: str, wanted: str, *, by_basename: bool) -> bool:
    if word == wanted:
        return True
    return by_basename and "/" not in wanted and os.path.basename(word) == wanted


def prefix_matches(argv: Sequence[str], prefix: Sequence[str], *, by_basename: bool) -> bool:
    if not prefix or len(argv) < len(prefix):
        return False
    if not _program_matches(argv[0], prefix[0], by_basename=by_basename):
        return False
    return tuple(argv[1 : len(prefix)]) == tuple(prefix[1:])


def _deny_prefix_match(argv: Sequence[str], prefix: Sequence[str]) -> bool | None:
    """Deny-rule matching: by program basename, and None (cannot tell) when a word
    that decides the match comes from an expansion such as $VAR."""
    if not prefix or len(argv) < len(prefix):
        return False
    for index, wanted in enumerate(prefix):
        word = argv[index]
        if "$" in word:
            return None
        if not (
            word == wanted or (index == 0 and _program_matches(word, wanted, by_basename=True))
        ):
            return False
    return True


class PermissionPolicy:
    def __init__(
        self,
        mode: ApprovalMode | str,
        *,
        workspace: Path,
        extra_roots: Iterable[Path] = (),
        allow: Iterable[Rule | str] = (),
        deny: Iterable[Rule | str] = (),
    ) -> None:
        self.mode = ApprovalMode(mode)
        self.roots = tuple(Path(os.path.realpath(p)) for p in (workspace, *extra_roots))
        self.allow = [r if isinstance(r, Rule) else Rule.parse(r) for r in allow]
        self.deny = [r if isinstance(r, Rule) else Rule.parse(r) for r in deny]

    @classmethod
    def for_context(
        cls,
        ctx: ToolContext,
        mode: ApprovalMode | str,
        allow: Iterable[Rule | str] = (),
        deny: Iterable[Rule | str] = (),
    ) -> PermissionPolicy:
        return cls(
            mode, workspace=ctx.workspace, extra_roots=ctx.extra_roots, allow=allow, deny=deny
        )

    def check(self, call: ToolCall) -> Decision:
        return self.check_access(call.name, call.access)

    def check_access(self, tool: str, access: ToolAccess) -> Decision:
        resolved: list[ResolvedPath] = []
        for raw in access.paths:
            try:
                resolved.append(resolve_path(raw, self.roots))
            except PathError as exc:
                return Decision(Verdict.DENY, str(exc), access.summary)
        analysis = analyze(access.command) if access.command is not None else None
        verdict, reason = self._judge(tool, access, resolved, analysis)
        return Decision(verdict, reason, access.summary)

    def _judge(
        self,
        tool: str,
        access: ToolAccess,
        resolved: list[ResolvedPath],
        analysis: CommandAnalysis | None,
    ) -> tuple[Verdict, str]:
        if access.effect is Effect.WRITE:
            for path in resolved:
                if path.is_git_internal:
                    return (
                        Verdict.DENY,
                        f"{path.display} is inside .git; file tools never write there",
                    )
        cwd = resolved[0].real if (analysis is not None and resolved) else self.roots[0]
        denied, unknown_deny = self._deny_rules(tool, resolved, analysis)
        if denied is not None:
            return Verdict.DENY, f"denied by rule '{denied}'"
        if self.mode is ApprovalMode.READ_ONLY and access.effect is not Effect.READ:
            if analysis is None:
                return Verdict.DENY, "read-only mode does not allow changes"
            problem = self.read_only_problem(analysis, cwd)
            if problem:
                return Verdict.DENY, f"read-only mode only runs read-only commands: {problem}"
            return Verdict.ALLOW, "a read-only command"
        if unknown_deny is not None and analysis is not None:
            hidden = analysis.visibility_problem() or "it expands variables"
            return Verdict.ASK, (
                f"cannot tell whether it runs something denied by rule '{unknown_deny}' ({hidden})"
            )
        sensitive = [(p, why) for p in resolved if (why := sensitivity(p))]
        if sensitive and not self._allowed_by_path_rules(tool, [p for p, _ in sensitive]):
            path, why = sensitive[0]
            return Verdict.ASK, f"{path.display} needs approval: {why}"
        if access.effect is Effect.READ:
            return Verdict.ALLOW, "reading is allowed"
        if access.escalation:
            return Verdict.ASK, access.escalation
        if self.mode is ApprovalMode.FULL_AUTO:
            return Verdict.ALLOW, "full-auto mode"
        if access.effect is Effect.WRITE:
            if self.mode is ApprovalMode.AUTO_EDIT:
                return Verdict.ALLOW, "auto-edit mode allows file changes in the workspace"
            if self._allowed_by_path_rules(tool, resolved):
                return Verdict.ALLOW, "allowed by an allow rule"
            return Verdict.ASK, f"{self.mode.value} mode asks before changing files"
        if analysis is None:
            if any(r.covers_tool(tool) and r.pattern is None for r in self.allow):
                return Verdict.ALLOW, "allowed by an allow rule"
            return Verdict.ASK, f"{self.mode.value} mode asks before running {tool}"
        problem = self.read_only_problem(analysis, cwd)
        if problem is None:
            return Verdict.ALLOW, "a read-only command"
        if self._rules_problem(tool, analysis, cwd) is None:
            return Verdict.ALLOW, "allowed by allow rules"
        return Verdict.ASK, f"{self.mode.value} mode asks before running it: {problem}"

    def _deny_rules(
        self, tool: str, resolved: list[ResolvedPath], analysis: CommandAnalysis | None
    ) -> tuple[Rule | None, Rule | None]:
        """(the deny rule that matches, a deny rule that might match but cannot be checked)."""
        unknown: Rule | None = None
        for rule in self.deny:
            if not rule.covers_tool(tool):
                continue
            if rule.pattern is None:
                return rule, None
            if analysis is not None:
                hit = self._shell_rule_hits(rule, analysis)
                if hit:
                    return rule, None
                if hit is None:
                    unknown = unknown or rule
            elif any(rule.matches_path(p) for p in resolved):
                return rule, None
        return None, unknown

    # -- shell -------------------------------------------------------------

    def _shell_rule_hits(self, rule: Rule, analysis: CommandAnalysis) -> bool | None:
        """True if some command the line runs matches the rule's prefix; None when
        the line hides part of what it runs, so a match cannot be ruled out."""
        prefix = rule.prefix_tokens()
        unsure = analysis.visibility_problem() is not None
        for command in analysis.commands:
            for position in command_positions(command.argv):
                match = _deny_prefix_match(position, prefix)
                if match is True:
                    return True
                unsure |= match is None
        return None if unsure else False

    def read_only_problem(self, analysis: CommandAnalysis, cwd: Path) -> str | None:
        """Why the line is not a read-only command confined to the workspace, or None."""
        problem = analysis.visibility_problem()
        if problem:
            return problem
        if analysis.background:
            return "it starts a background job"
        cwds = [cwd]
        for command in analysis.commands:
            if command.expands:
                return "it expands variables, so what it touches is not known in advance"
            if command.assignments:
                return f"it sets {command.assignments[0].split('=', 1)[0]}"
            problem = self._redirect_problem(command, cwds, writes_allowed=False)
            if problem:
                return problem
            problem = read_only_problem(command.argv)
            if problem:
                return problem
            for operand in path_operands(command.argv):
                problem = self._operand_problem(operand, cwds)
                if problem:
                    return problem
            if command.argv[:1] == ("cd",) and len(command.argv) > 1:
                # Later words may be relative to either directory (cd can fail).
                cwds.append(Path(os.path.realpath(cwds[-1] / os.path.expanduser(command.argv[1]))))
        return None

    def _operand_problem(self, word: str, cwds: list[Path]) -> str | None:
        if word in ("-", ""):
            return None
        probe = re.split(r"[*?\[{]", word, maxsplit=1)[0] or "."
        for cwd in cwds:
            try:
                resolved = resolve_path(probe, self.roots, base=cwd)
            except PathError:
                return f"{word} is outside the workspace"
            why = sensitivity(resolved)
            if why:
                return f"{word} needs approval: {why}"
        return None

    def _redirect_problem(
        self, command: SimpleCommand, cwds: list[Path], *, writes_allowed: bool
    ) -> str | None:
        for redirect in command.redirects:
            if redirect.writes_file:
                if not writes_allowed:
                    return f"it writes to {redirect.target} (redirect {redirect.operator})"
                problem = self._operand_problem(redirect.target or "", cwds)
                if problem:
                    return problem
            elif redirect.reads_file:
                problem = self._operand_problem(redirect.target or "", cwds)
                if problem:
                    return problem
        return None

    def _rules_problem(self, tool: str, analysis: CommandAnalysis, cwd: Path) -> str | None:
        """None when allow rules (or the read-only list) cover every command of the line."""
        rules = [r for r in self.allow if r.covers_tool(tool)]
        if not rules:
            return "no allow rule covers it"
        if any(r.pattern is None for r in rules):
            return None
        problem = analysis.visibility_problem()
        if problem:
            return problem
        if analysis.background:
            return "it starts a background job"
        writes_allowed = self.mode in (ApprovalMode.AUTO_EDIT, ApprovalMode.FULL_AUTO)
        for command in analysis.commands:
            if not command.argv:
                continue
            problem = self._redirect_problem(command, [cwd], writes_allowed=writes_allowed)
            if problem:
                return problem
            if any(_DANGEROUS_ASSIGNMENT.match(a) for a in command.assignments):
                return "it sets a variable that changes what runs"
            single = CommandAnalysis(source=analysis.source, commands=[command])
            if self.read_only_problem(single, cwd) is None:
                continue
            covered = any(
                prefix_matches(command.argv, tokens, by_basename=False)
                and not any(i < len(tokens) for i in command.expanding_words)
                for tokens in (r.prefix_tokens() for r in rules)
            )
            if not covered:
                return f"no allow rule covers {shlex.join(command.argv)}"
        return None

    def _allowed_by_path_rules(self, tool: str, paths: Sequence[ResolvedPath]) -> bool:
        rules = [r for r in self.allow if r.covers_tool(tool)]
        if not rules or not paths:
            return False
        return all(any(r.pattern is None or r.matches_path(p) for r in rules) for p in paths)
