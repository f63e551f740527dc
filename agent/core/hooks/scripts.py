"""The scripts a repository's hooks run, covered by the person's trust before and during a session.

`resident hooks trust` trusts `.resident/hooks.json` together with every
workspace file its commands name (agent/core/repository_trust.py). At
session start the hooks run only if that whole digest is the trusted one
(active.py). The scripts stay writable for the model (they are ordinary
project files), so before each run of a repository hook `ScriptGuard`
hashes them again: once one changed, none of the repository's hooks runs
for the rest of the session, and the person is told to read and trust them
again. What runs is therefore always what was trusted.
"""

from __future__ import annotations

from pathlib import Path

from agent.core.hooks.config import HookFile
from agent.core.repository_trust import Coverage, cover, recheck, shell_words

TRUST_COMMAND = "resident hooks trust"


def hooks_coverage(loaded: HookFile, workspace: Path) -> Coverage:
    """The hooks file's digest with the files its commands name, as they are now."""
    words = [word for hook in loaded.hooks for word in shell_words(hook.command)]
    return cover(loaded.digest, words, workspace)


def describe_change(changed: list[str]) -> str:
    if not changed:
        return "the file changed"
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return f"{shown} (which its hooks run) changed"


class ScriptGuard:
    """Says whether the scripts trusted at session start still hold what was trusted."""

    def __init__(self, coverage: Coverage, workspace: Path, hooks_file: Path) -> None:
        self.coverage = coverage
        self.workspace = workspace
        self.hooks_file = hooks_file

    def problem(self) -> str | None:
        """None while every covered file is unchanged; else what to tell the person."""
        changed = recheck(self.coverage, self.workspace)
        if not changed:
            return None
        return (
            f"{self.hooks_file}: {describe_change(changed)} since you trusted it, so this "
            "repository's hooks no longer run in this session. Read them, then run "
            f"`{TRUST_COMMAND}` again."
        )
