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
   auto-edit, allowed in full-auto; tools another program carries out
   (MCP servers' tools, `external`) ask in ask and auto-edit, run in
   full-auto or when an allow rule names them (`mcp__SERVER`,
   `mcp__SERVER__TOOL`), and in read-only mode run only when a rule names
   them: the agent cannot see what they do, so the user must have said so.
   Plan mode is judged exactly as read-only (`ApprovalMode.read_only`); only
   the mode's name in the reasons differs.
4. Resident's configuration and state (tools.permissions.config_zone), which
   only tightens the above: no file tool writes the user's config, data or
   cache folder in any mode, wherever it lies; a write to a repository's
   `.resident/` or `.residentignore` asks by name every time (`once`), never
   covered by a mode, a rule or "allow for this session".
Web fetches (`ToolAccess.url`) are judged by their host alone, the same in
every mode but plan mode, which asks before every fetch: deny rules, allow rules
naming the host, `--network` for public hosts, else ask; the addresses a host
resolves to are judged again by the tool (tools.permissions.web_rules).

Shell commands run in an OS sandbox (tools.sandbox.bubblewrap) and the decision says
what the sandbox grants: a command allowed as read-only gets a read-only
workspace; one that was approved, or allowed by the mode or a rule, gets a
writable one; network only where the user allowed it (`--network`, or an
allow rule `network:PREFIX` covering every command of the line that is not
read-only). The sandbox, not the parser, is what confines a command: with
it, a read-only command may expand variables or name paths outside the
workspace (they do not exist in there). Without a sandbox the policy fails
closed: read-only mode offers no shell, and every other command asks unless
the user allowed the shell tool as a whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tools.base import Effect, ToolAccess, ToolCall
from tools.context import ToolContext
from tools.permissions.approval import ApprovalMode, Decision, Rule, Verdict
from tools.permissions.config_zone import judge_zones
from tools.permissions.shell_rules import DANGEROUS_ASSIGNMENT, ShellJudgement, prefix_matches
from tools.permissions.web_rules import judge_fetch
from tools.sandbox.grants import READ_ONLY
from tools.shell.parse import CommandAnalysis, analyze
from tools.workspace.paths import PathError, ResolvedPath, resolve_path, sensitivity
from tools.workspace.protected import StateDir, find_state_dirs

__all__ = [
    "DANGEROUS_ASSIGNMENT",
    "ApprovalMode",
    "Decision",
    "PermissionPolicy",
    "Rule",
    "Verdict",
    "prefix_matches",
]

SHELL_TOOL = "shell"


class PermissionPolicy(ShellJudgement):
    def __init__(
        self,
        mode: ApprovalMode,
        *,
        workspace: Path,
        extra_roots: Iterable[Path] = (),
        allow: Iterable[Rule | str] = (),
        deny: Iterable[Rule | str] = (),
        sandboxed: bool = False,
        network: bool = False,
        state_dirs: Iterable[StateDir] | None = None,
    ) -> None:
        self.mode = mode
        # Resident's own folders: never written by a file tool (config_zone.py). Found
        # from the environment unless given, so no policy is ever without them.
        self.state_dirs = tuple(find_state_dirs() if state_dirs is None else state_dirs)
        self.sandboxed = sandboxed  # shell commands run in an OS sandbox
        self.network = network  # the user allowed network for every command
        self.roots = tuple(Path(os.path.realpath(p)) for p in (workspace, *extra_roots))
        self.allow = [r if isinstance(r, Rule) else Rule.parse(r) for r in allow]
        self.deny = [r if isinstance(r, Rule) else Rule.parse(r) for r in deny]
        # Ask before every web fetch, as plan mode does, in another mode too: set on the
        # read-only child a plan-mode task delegates to (agent/core/subagents), so a
        # plan's research cannot send data out in a URL either.
        self.fetches_ask = False

    @classmethod
    def for_context(
        cls,
        ctx: ToolContext,
        mode: ApprovalMode,
        allow: Iterable[Rule | str] = (),
        deny: Iterable[Rule | str] = (),
    ) -> PermissionPolicy:
        return cls(
            mode,
            workspace=ctx.workspace,
            extra_roots=ctx.extra_roots,
            allow=allow,
            deny=deny,
            sandboxed=ctx.sandbox is not None,
            network=ctx.sandbox_settings.network,
            state_dirs=ctx.protected_dirs,
        )

    @property
    def mode(self) -> ApprovalMode:
        return self._mode

    @mode.setter
    def mode(self, mode: ApprovalMode) -> None:
        # The judgement compares modes by identity: a string such as "read-only" would
        # match no mode and judge like ask, looser than read-only. Text is parsed where
        # it comes in (ApprovalMode.parse), so a string here is a bug, refused loudly.
        if not isinstance(mode, ApprovalMode):
            raise TypeError(f"the approval mode must be an ApprovalMode, not {mode!r}")
        self._mode = mode

    def check(self, call: ToolCall) -> Decision:
        return self.check_access(call.name, call.access)

    def check_access(self, tool: str, access: ToolAccess) -> Decision:
        if access.url is not None:  # a web fetch: judged by its host (web_rules)
            return judge_fetch(
                tool,
                access,
                planning=self.mode is ApprovalMode.PLAN or self.fetches_ask,
                network=self.network,
                allow=self.allow,
                deny=self.deny,
            )
        resolved: list[ResolvedPath] = []
        for raw in access.paths:
            try:
                resolved.append(resolve_path(raw, self.roots))
            except PathError as exc:
                return Decision(Verdict.DENY, str(exc), access.summary)
        analysis = analyze(access.command) if access.command is not None else None
        verdict, reason = self._judge(tool, access, resolved, analysis)
        once = False
        if verdict is not Verdict.DENY:
            # Resident's configuration and state: only ever stricter than the above.
            ruling = judge_zones(access.effect, resolved, self.state_dirs, self.mode)
            if ruling is not None and (
                ruling.verdict is Verdict.DENY or ruling.once or verdict is Verdict.ALLOW
            ):
                verdict, reason, once = ruling.verdict, ruling.reason, ruling.once
        grant = READ_ONLY
        if analysis is not None and verdict is not Verdict.DENY:
            grant = self._grant(analysis, self._cwd(resolved))
        return Decision(verdict, reason, access.summary, grant, once)

    def _cwd(self, resolved: list[ResolvedPath]) -> Path:
        return resolved[0].real if resolved else self.roots[0]

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
        cwd = self._cwd(resolved) if analysis is not None else self.roots[0]
        denied, unknown_deny = self._deny_rules(tool, resolved, analysis)
        if denied is not None:
            return Verdict.DENY, f"denied by rule '{denied}'"
        if unknown_deny is not None and analysis is not None:
            # Before anything that could allow it, a tool-wide allow rule included.
            hidden = analysis.visibility_problem() or (
                "it expands words, or a wrapper or git option the matcher cannot follow"
            )
            verdict = Verdict.DENY if self.mode.read_only else Verdict.ASK
            return verdict, (
                f"cannot tell whether it runs something denied by rule '{unknown_deny}' ({hidden})"
            )
        if analysis is not None and not self.sandboxed:
            return self._judge_unsandboxed(tool)
        if access.external:
            return self._judge_external(tool)
        if self.mode.read_only and access.effect is not Effect.READ:
            if analysis is None:
                return Verdict.DENY, f"{self.mode.value} mode does not allow changes"
            problem = self.read_only_problem(analysis, cwd)
            if problem:
                return Verdict.DENY, (
                    f"{self.mode.value} mode only runs read-only commands: {problem}"
                )
            return Verdict.ALLOW, "a read-only command"
        sensitive = [(p, why) for p in resolved if (why := sensitivity(p))]
        if sensitive and not self._allowed_by_path_rules(tool, [p for p, _ in sensitive]):
            path, why = sensitive[0]
            return Verdict.ASK, f"{path.display} needs approval: {why}"
        if access.effect is Effect.READ:
            return Verdict.ALLOW, "reading is allowed"
        if access.escalation:
            return Verdict.ASK, access.escalation
        if access.runs_repository_code and not self.sandboxed:
            return Verdict.ASK, "it runs the repository's hooks, and there is no sandbox"
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

    def _judge_external(self, tool: str) -> tuple[Verdict, str]:
        """A tool another program carries out (an MCP server's): it may do anything, so
        read-only mode runs it only when an allow rule names it (or its server)."""
        named = next((r for r in self.allow if r.names_tool(tool) and r.pattern is None), None)
        if self.mode.read_only:
            if named is not None:
                return Verdict.ALLOW, f"allowed by the allow rule '{named}'"
            return Verdict.DENY, (
                f"{self.mode.value} mode does not call MCP tools unless an allow rule names "
                "the tool or its server"
            )
        if named is not None or any(r.tool == "*" and r.pattern is None for r in self.allow):
            return Verdict.ALLOW, "allowed by an allow rule"
        if self.mode is ApprovalMode.FULL_AUTO:
            return Verdict.ALLOW, "full-auto mode"
        return Verdict.ASK, f"{self.mode.value} mode asks before calling an MCP server's tool"

    def _judge_unsandboxed(self, tool: str) -> tuple[Verdict, str]:
        """Fail closed: with no sandbox the parser's word is not enough to run anything."""
        if self.mode.read_only:
            return Verdict.DENY, f"{self.mode.value} mode offers no shell when there is no sandbox"
        if any(r.covers_tool(tool) and r.pattern is None for r in self.allow):
            return Verdict.ALLOW, f"allowed by the allow rule '{tool}' (no sandbox)"
        return Verdict.ASK, "there is no sandbox, so every command asks"

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

    def _allowed_by_path_rules(self, tool: str, paths: Sequence[ResolvedPath]) -> bool:
        rules = [r for r in self.allow if r.covers_tool(tool)]
        if not rules or not paths:
            return False
        return all(any(r.pattern is None or r.matches_path(p) for r in rules) for p in paths)
