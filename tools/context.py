"""What every tool run needs to know: where it may act, what it has read, its caps."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tools.files.state import FileStateLedger
from tools.sandbox.grants import CommandSandbox, SandboxSettings
from tools.workspace.protected import StateDir, find_state_dirs


class FileAccess(Protocol):
    """Reads and writes through someone who holds the files' live text (an editor).

    Both are called from the worker thread a tool runs in and may block on
    the editor for a while.
    """

    def read_text(self, path: Path) -> str | None:
        """The text of `path` (absolute, resolved) as the user sees it, unsaved
        changes included; None to read the disk instead."""
        ...

    def write_text(self, path: Path, content: str) -> bool:
        """Write `content` to `path` through the editor; False when it does not offer
        that (the disk is written instead). Raises OSError when the editor failed."""
        ...


@dataclass(frozen=True)
class ToolLimits:
    """Caps that keep one tool result from flooding the context or the machine."""

    read_max_lines: int = 2000
    read_max_line_chars: int = 2000
    read_max_output_chars: int = 100_000
    edit_max_file_bytes: int = 10 * 1024 * 1024
    list_max_entries: int = 1000
    glob_max_results: int = 500
    grep_max_results: int = 200
    grep_max_line_chars: int = 300
    diff_max_chars: int = 30_000
    shell_timeout_s: float = 120.0
    shell_max_timeout_s: float = 600.0
    shell_output_chars: int = 30_000
    # Per process: a runaway loop stops; a build on every core for the whole
    # timeout still fits (the wall-clock timeout is the real bound).
    shell_cpu_seconds: int = 600 * 16
    shell_max_file_bytes: int = 8 * 1024**3
    # Processes a shell run may add on top of what the user already runs:
    # RLIMIT_NPROC counts every task of the user, not just this tree.
    shell_process_budget: int = 1024
    # Time between SIGTERM and SIGKILL when a run is stopped.
    shell_kill_grace_s: float = 2.0


@dataclass
class ToolContext:
    """Per-session state shared by all tools.

    `workspace` and `extra_roots` are resolved once (symlinks included), so
    confinement checks compare real paths. `cancel_event` is the agent's
    interrupt: setting it stops a running shell command (its whole process
    group). `env` is the environment shell commands start from, before
    the allow-list is applied. `sandbox` is the OS sandbox shell commands run
    in; None means there is none (the permission policy then fails closed).
    `file_access` is the editor the read, write and edit tools go through
    when one drives the agent (tools.files.access); None: the disk.
    `state_dirs` are Resident's own folders (config, data, cache) by real path: no
    file tool writes there, and commands find them read-only wherever they lie
    (tools.workspace.protected). None: found from `env` and this process's
    environment when the context is made, so no context is ever without them.
    """

    workspace: Path
    extra_roots: tuple[Path, ...] = ()
    limits: ToolLimits = field(default_factory=ToolLimits)
    file_states: FileStateLedger = field(default_factory=FileStateLedger)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    env: Mapping[str, str] | None = None
    use_ripgrep: bool = True
    sandbox: CommandSandbox | None = None
    sandbox_settings: SandboxSettings = field(default_factory=SandboxSettings)
    file_access: FileAccess | None = None
    state_dirs: tuple[StateDir, ...] | None = None

    def __post_init__(self) -> None:
        if self.state_dirs is None:
            self.state_dirs = find_state_dirs(self.env)
        self.workspace = Path(os.path.realpath(self.workspace))
        self.extra_roots = tuple(Path(os.path.realpath(root)) for root in self.extra_roots)
        if not self.workspace.is_dir():
            raise NotADirectoryError(f"workspace {self.workspace} is not a directory")

    @property
    def allowed_roots(self) -> tuple[Path, ...]:
        return (self.workspace, *self.extra_roots)

    @property
    def protected_dirs(self) -> tuple[StateDir, ...]:
        return self.state_dirs or ()

    @property
    def protected_paths(self) -> tuple[Path, ...]:
        """The state dirs' real paths: what every folder walk leaves out (tools.workspace.walk)."""
        return tuple(state.path for state in self.protected_dirs)

    def base_env(self) -> Mapping[str, str]:
        return os.environ if self.env is None else self.env
