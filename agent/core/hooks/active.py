"""Which of the configured hooks run in this session, and what the user is told about the rest.

The user's hooks run as the user's own commands: unconfined, like a command
typed into a terminal (what Claude Code, Gemini CLI and Codex do). A
repository's hooks run only when the user has trusted that file's exact
content (trust.py) and there is a sandbox to run them in; otherwise none of
them runs, and the session says why once, with the command that changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.core.hooks.config import Hook, HooksConfig, load_hooks
from agent.core.hooks.trust import HookTrust

TRUST_COMMAND = "resident hooks trust"


@dataclass(frozen=True)
class Notice:
    """Something about the session's hooks the user must hear once (an `error` event)."""

    kind: str  # hook_config (a broken file), hook_trust (repository hooks that do not run)
    message: str


@dataclass
class ActiveHooks:
    hooks: list[Hook] = field(default_factory=list)  # user's first, then the repository's
    notices: list[Notice] = field(default_factory=list)


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
    state = (trust or HookTrust()).state(workspace, repo.digest)
    if state != "trusted":
        why = "changed since you trusted it" if state == "changed" else "not trusted"
        active.notices.append(
            Notice(
                "hook_trust",
                f"{repo.path} declares {count} that did not run: the file is {why}. Read it, "
                f"then run `{TRUST_COMMAND}` in this repository to let them run (in the sandbox).",
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
    return active


def configured_hooks(workspace: Path) -> HooksConfig | None:
    """The workspace's hooks config, or None when no hooks file exists (no hooks at all)."""
    config = load_hooks(workspace)
    return None if config.empty else config
