"""Which of the configured hooks run in this session, and what the user is told about the rest.

The user's hooks run as the user's own commands: unconfined, like a command
typed into a terminal (what Claude Code, Gemini CLI and Codex do). A
repository's hooks run only when the user has trusted that file's exact
content and the scripts its commands name (trust.py, scripts.py) and there
is a sandbox to run them in; otherwise none of them runs, and the session
says why once, with the command that changes it. A trusted set comes with a
`ScriptGuard`, which stops them for the rest of the session once a script
changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.core.hooks.config import Hook, HooksConfig, load_hooks
from agent.core.hooks.scripts import TRUST_COMMAND, ScriptGuard, describe_change, hooks_coverage
from agent.core.hooks.trust import HookTrust

__all__ = ["TRUST_COMMAND", "ActiveHooks", "Notice", "active_hooks", "configured_hooks"]


@dataclass(frozen=True)
class Notice:
    """Something about the session's hooks the user must hear once (an `error` event)."""

    kind: str  # hook_config (a broken file), hook_trust (repository hooks that do not run)
    message: str


@dataclass
class ActiveHooks:
    hooks: list[Hook] = field(default_factory=list)  # user's first, then the repository's
    notices: list[Notice] = field(default_factory=list)
    guard: ScriptGuard | None = None  # the repository's scripts, checked before each run


def active_hooks(
    config: HooksConfig, workspace: Path, sandboxed: bool, trust: HookTrust | None = None
) -> ActiveHooks:
    """The hooks to run, given whether a sandbox exists for the repository's."""
    active = ActiveHooks()
    for problem in config.problems:
        active.notices.append(
            Notice("hook_config", f"{problem.describe()}; none of this file's hooks run")
        )
    if config.user is not None:
        active.hooks.extend(config.user.hooks)
    repo = config.repository
    if repo is None or not repo.hooks:
        return active
    count = f"{len(repo.hooks)} hook{'s' if len(repo.hooks) != 1 else ''}"
    trust = trust or HookTrust()
    coverage = hooks_coverage(repo, workspace)
    state = trust.state(workspace, coverage.digest)
    if state != "trusted":
        if state == "changed":
            changed = coverage.changed_since(trust.trusted_files(workspace))
            why = f"{describe_change(changed)} since you trusted it"
        else:
            why = "the file is not trusted"
        active.notices.append(
            Notice(
                "hook_trust",
                f"{repo.path} declares {count} that did not run: {why}. Read it and the "
                f"scripts it runs, then run `{TRUST_COMMAND}` in this repository to let them "
                "run (in the sandbox).",
            )
        )
    elif not sandboxed:
        active.notices.append(
            Notice(
                "hook_trust",
                f"{repo.path} declares {count} that did not run: a repository's hooks run only "
                "inside the sandbox, and there is none here.",
            )
        )
    else:
        active.hooks.extend(repo.hooks)
        if coverage.files:
            active.guard = ScriptGuard(coverage, workspace, repo.path)
    return active


def configured_hooks(workspace: Path) -> HooksConfig | None:
    """The workspace's hooks config, or None when no hooks file exists (no hooks at all)."""
    config = load_hooks(workspace)
    return None if config.empty else config
