"""What every tool, the permission policy and the agent say about the OS sandbox.

The words, not an implementation: what one command may do (`SandboxGrant`,
`READ_ONLY`), what the user chose for every command (`SandboxSettings`), the
error a sandbox raises when it cannot confine a command safely
(`SandboxError`), and what any sandbox offers (`CommandSandbox`). bubblewrap
(`tools.sandbox.bubblewrap`) is the one implementation; it imports this module,
never the other way, so a tool that only names a grant does not depend on how
commands are confined (tests/test_layout_rules.py keeps it so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class SandboxError(Exception):
    """A command cannot be wrapped safely; it must not run as asked."""


@dataclass(frozen=True)
class SandboxGrant:
    """What one command may do beyond reading the workspace: granted per call by the
    permission policy. The default grants nothing."""

    write: bool = False  # the workspace (not .git, not project config) is writable
    network: bool = False
    # Secret files (.env, keys) readable: only for a command a person approved.
    # Full-auto and allow rules write without a person, so they still see them empty.
    secrets: bool = False


READ_ONLY = SandboxGrant()


@dataclass(frozen=True)
class SandboxSettings:
    """The user's choices: network for every command, variables to pass through, more
    read-only folders (toolchains the PATH heuristics miss)."""

    network: bool = False
    env_names: tuple[str, ...] = ()
    read_only_paths: tuple[Path, ...] = ()


class CommandSandbox(Protocol):
    """A working sandbox, as the tools, hooks and MCP launchers use it."""

    def describe(self) -> str:
        """What confines commands, for the session's first event and `/status`."""
        ...

    def wrap(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        cwd: Path,
        grant: SandboxGrant = READ_ONLY,
        extra_roots: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
        settings: SandboxSettings | None = None,
        git_writable: bool = False,
        extra_read_only: Sequence[Path] = (),
    ) -> list[str]:
        """The command line that runs `argv` in `cwd` confined to `grant`; raises
        SandboxError when it cannot be confined safely."""
        ...
