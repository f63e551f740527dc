"""How the permission policy judges a shell line: read-only or not, rules, the sandbox grant.

A mixin of PermissionPolicy (which holds `mode`, `roots`, `allow`, `sandboxed`
and `network`), kept apart so each file reads in one go. Rules are matched
against what really runs (tools.shell.normalize takes wrappers and git's
global options off); the read-only check is the parser's classification
(tools.shell.readonly), which with a sandbox decides only whether a
command needs approval, not where it may reach.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from tools.permissions.approval import ApprovalMode, Rule
from tools.sandbox.grants import SandboxGrant
from tools.shell.normalize import Layer, allow_covers, deny_hits, deny_prefixes, reduce_command
from tools.shell.parse import CommandAnalysis, SimpleCommand
from tools.shell.readonly import path_operands, read_only_problem
from tools.workspace.paths import PathError, resolve_path, sensitivity

# Variables that change which program runs or what it loads (BASH_FUNC_name%% is an
# exported function, which `env` can set).
DANGEROUS_ASSIGNMENT = re.compile(
    r"^(PATH|IFS|ENV|BASH_ENV|BASH_FUNC_\S*|PS4|PROMPT_COMMAND|SHELLOPTS|BASHOPTS|CDPATH|"
    r"PYTHON\w*|NODE_OPTIONS|NODE_PATH|PERL5OPT|PERL5LIB|PERLLIB|RUBYOPT|RUBYLIB|GCONV_PATH|"
    r"LD_\w*|DYLD_\w*|GIT_\w*|MAKEFLAGS|GNUMAKEFLAGS|MAKEFILES|RUSTC|RUSTC_WRAPPER|CARGO_\w*|"
    r"npm_config_\w*|NPM_CONFIG_\w*|EDITOR|VISUAL|PAGER|SHELL)="
)


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


def _written(command: SimpleCommand) -> Layer:
    return Layer.of(command.argv, command.expanding_words)


def _only_substitutions(analysis: CommandAnalysis) -> bool:
    """The line hides nothing but command substitutions, whose commands the parser
    listed with the others (so they are judged like them)."""
    return analysis.error is None and not analysis.opaque


class ShellJudgement:
    """The shell half of PermissionPolicy."""

    mode: ApprovalMode
    roots: tuple[Path, ...]
    allow: list[Rule]
    sandboxed: bool
    network: bool

    def _grant(self, analysis: CommandAnalysis, cwd: Path) -> SandboxGrant:
        """What the sandbox gives a shell line that runs: writes unless it is a read-only
        command (or the mode is read-only or plan); network where the user allowed it."""
        write = not self.mode.read_only and (self.read_only_problem(analysis, cwd) is not None)
        network = self.network or self._network_rules_cover(analysis, cwd)
        return SandboxGrant(write=write, network=network)

    def _network_rules_cover(self, analysis: CommandAnalysis, cwd: Path) -> bool:
        rules = [r.prefix_tokens() for r in self.allow if r.tool == "network" and r.pattern]
        if not rules or analysis.visibility_problem() or not analysis.commands:
            return False
        for command in analysis.commands:
            single = CommandAnalysis(source=analysis.source, commands=[command])
            if self.read_only_problem(single, cwd) is None:
                continue
            reduction = reduce_command(command.argv, command.expanding_words)
            written = _written(command)
            if not any(allow_covers(written, reduction, tokens) for tokens in rules):
                return False
        return True

    def _shell_rule_hits(self, rule: Rule, analysis: CommandAnalysis) -> bool | None:
        """True if some command the line runs matches the rule's prefix; None when
        the line hides part of what it runs, so a match cannot be ruled out."""
        # Matched against what really runs: wrappers (env, nice, timeout, xargs, sudo, ...)
        # and git's global options taken off, by tools.shell.normalize, which also
        # says when it cannot follow a command (None: cannot tell).
        prefixes = deny_prefixes(rule.prefix_tokens())
        unsure = analysis.visibility_problem() is not None
        for command in analysis.commands:
            hit = deny_hits(_written(command), prefixes)
            if hit:
                return True
            unsure |= hit is None
        return None if unsure else False

    def read_only_problem(self, analysis: CommandAnalysis, cwd: Path) -> str | None:
        """Why the line is not a read-only command confined to the workspace, or None.

        In the sandbox only what the line would do counts (programs and options on
        the read-only list, no writing redirect): where it reaches is the sandbox's
        business, since outside paths, home and secrets are not there to read."""
        problem = analysis.visibility_problem()
        if problem and not (self.sandboxed and _only_substitutions(analysis)):
            return problem
        if analysis.background and not self.sandboxed:
            return "it starts a background job"
        cwds = [cwd]
        for command in analysis.commands:
            if command.expands and not self.sandboxed:
                return "it expands variables, so what it touches is not known in advance"
            if command.assignments and (
                not self.sandboxed
                or any(DANGEROUS_ASSIGNMENT.match(a) for a in command.assignments)
            ):
                return f"it sets {command.assignments[0].split('=', 1)[0]}"
            if self.sandboxed:
                problem = next(
                    (
                        f"it writes to {r.target} (redirect {r.operator})"
                        for r in command.redirects
                        if r.writes_file
                    ),
                    None,
                )
            else:
                problem = self._redirect_problem(command, cwds, writes_allowed=False)
            if problem:
                return problem
            problem = read_only_problem(command.argv)
            if problem:
                return problem
            for operand in path_operands(command.argv):
                problem = self._operand_problem(operand, cwds, reading=True)
                if problem:
                    return problem
            if command.argv[:1] == ("cd",) and len(command.argv) > 1:
                # Later words may be relative to either directory (cd can fail).
                cwds.append(Path(os.path.realpath(cwds[-1] / os.path.expanduser(command.argv[1]))))
        return None

    def _operand_problem(self, word: str, cwds: list[Path], *, reading: bool = False) -> str | None:
        """Outside paths (unless the sandbox hides them from a read) and secrets named
        outright."""
        if word in ("-", ""):
            return None
        probe = re.split(r"[*?\[{]", word, maxsplit=1)[0] or "."
        for cwd in cwds:
            try:
                resolved = resolve_path(probe, self.roots, base=cwd)
            except PathError:
                if self.sandboxed and reading:
                    continue  # not there to read inside the sandbox
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
            # An allow rule covers the command as written, or what it runs when the
            # wrappers on the way change nothing else (`timeout 60 make test`, not
            # `sudo make test`); an assignment made through `env` counts like one
            # made by the shell.
            reduction = reduce_command(command.argv, command.expanding_words)
            assignments = (*command.assignments, *reduction.assignments)
            if any(DANGEROUS_ASSIGNMENT.match(a) for a in assignments):
                return "it sets a variable that changes what runs"
            single = CommandAnalysis(source=analysis.source, commands=[command])
            if self.read_only_problem(single, cwd) is None:
                continue
            written = _written(command)
            if not any(allow_covers(written, reduction, r.prefix_tokens()) for r in rules):
                return f"no allow rule covers {shlex.join(command.argv)}"
        return None
