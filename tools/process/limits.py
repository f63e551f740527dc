"""Limits on what one command may consume, made to hold for root too.

RLIMIT_CPU and RLIMIT_FSIZE bind every user. RLIMIT_NPROC does not bind
root (the kernel exempts uid 0 of the initial namespace, and user namespaces
do not change the real uid), so where this process can create a cgroup with
the `pids` controller (cgroup v2 with delegation, or a writable v1 `pids`
hierarchy) the command runs in its own cgroup with `pids.max`; that limit
holds for root, and killing every task of the cgroup also reaches processes
that left the process group. Elsewhere RLIMIT_NPROC is set relative to the
user's current task count, which holds for ordinary users only.
"""

from __future__ import annotations

import functools
import itertools
import os
import resource
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()


@dataclass(frozen=True)
class Limits:
    """What to apply to one command (None: leave as inherited)."""

    processes: int | None = None  # tasks the command may run at once (beyond the start)
    cpu_seconds: int | None = None  # per process
    file_bytes: int | None = None  # largest file a process may write


def user_task_count(uid: int | None = None) -> int | None:
    """Tasks (processes and their threads) of this real uid visible now, or None if unknown.

    RLIMIT_NPROC counts threads too, so a desktop session with a browser
    open may already hold thousands; the limit has to be set above that.
    """
    uid = os.getuid() if uid is None else uid
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    count = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(
                line.split(":", 1) for line in (entry / "status").read_text().splitlines()
            )
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields.get("Threads", "1"))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return count


def process_limit(budget: int) -> int | None:
    """The RLIMIT_NPROC value that lets a command start about `budget` more processes.

    The limit counts every task of the user, so it is set relative to how
    many exist now; it never raises the current hard limit.
    """
    current = user_task_count()
    if current is None or budget <= 0:
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    wanted = current + budget
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _own_pids_parent() -> Path | None:
    """A cgroup directory under which this process may create a child with pids.max."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.lstrip("/")
        if number == "0" and controllers == "":  # cgroup v2
            base = CGROUP_ROOT / relative
            if "pids" in _read(base / "cgroup.subtree_control").split():
                return base if os.access(base, os.W_OK) else None
        elif "pids" in controllers.split(","):  # cgroup v1
            base = CGROUP_ROOT / "pids" / relative
            # (The hierarchy's root has no pids.max itself; its children do.)
            if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
                return base
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class PidsCgroup:
    """A fresh cgroup with `pids.max`, joined by the command before it execs."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self._procs = os.fsencode(path / "cgroup.procs")

    @property
    def procs_path(self) -> bytes:
        return self._procs

    @classmethod
    def create(cls, limit: int) -> PidsCgroup | None:
        parent = _own_pids_parent()
        if parent is None:
            return None
        path = parent / f"resident-{os.getpid()}-{next(_counter)}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(limit))
        except OSError:
            try:
                path.rmdir()
            except OSError:
                pass
            return None
        return cls(path, limit)

    def join(self) -> None:
        """Runs in the child between fork and exec: only a raw open and write."""
        fd = os.open(self._procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")  # "0" means the writing process itself
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self.path / "cgroup.procs").split() if p.isdigit()]

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def remove(self, wait_s: float = 2.0) -> None:
        """Kill what is left and remove the cgroup (it must be empty first)."""
        deadline = time.monotonic() + wait_s
        while True:
            self.kill_all()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return  # leaves an empty-to-be cgroup behind rather than hang
                time.sleep(0.01)


def process_cap_mechanism() -> str:
    """How the process limit holds here, in words (for the session and the docs)."""
    if _own_pids_parent() is not None:
        return "cgroup pids.max (holds for root)"
    if os.geteuid() == 0:
        return "none that binds root (no writable pids cgroup; RLIMIT_NPROC exempts root)"
    return "RLIMIT_NPROC (this user's tasks)"


def _capped(kind: int, soft: int, hard: int) -> tuple[int, int]:
    """(soft, hard) no higher than the current hard limit, which only root may raise."""
    _, current = resource.getrlimit(kind)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    return soft, hard


def _rlimit_settings(limits: Limits, nproc: int | None) -> list[tuple[int, tuple[int, int]]]:
    """The (kind, (soft, hard)) limits a command starts with."""
    settings = [(resource.RLIMIT_CORE, (0, 0))]
    if nproc is not None:
        settings.append((resource.RLIMIT_NPROC, (nproc, nproc)))
    if limits.cpu_seconds is not None:
        # SIGXCPU at the soft limit, SIGKILL at the hard one.
        cpu = _capped(resource.RLIMIT_CPU, limits.cpu_seconds, limits.cpu_seconds + 5)
        settings.append((resource.RLIMIT_CPU, cpu))
    if limits.file_bytes is not None:
        fsize = _capped(resource.RLIMIT_FSIZE, limits.file_bytes, limits.file_bytes)
        settings.append((resource.RLIMIT_FSIZE, fsize))
    return settings


# Joins the cgroup (its cgroup.procs path is $1, empty for none; "0" means the writing
# process itself) and fails closed if it cannot, then execs prlimit, which sets the
# limits and execs the command: the pid, and so the process group, stay the same.
_LAUNCHER = 'if [ -n "$1" ]; then echo 0 > "$1" || exit 126; fi; shift; exec "$@"'
_PRLIMIT_FLAGS = {
    resource.RLIMIT_CORE: "--core",
    resource.RLIMIT_NPROC: "--nproc",
    resource.RLIMIT_CPU: "--cpu",
    resource.RLIMIT_FSIZE: "--fsize",
}


@functools.cache
def _prlimit() -> str | None:
    return shutil.which("prlimit")


def limited_argv(
    argv: Sequence[str], limits: Limits, nproc: int | None, cgroup: PidsCgroup | None
) -> list[str] | None:
    """`argv` behind an exec-only launcher (/bin/sh, then util-linux's prlimit) that
    joins the cgroup and sets the limits before the command runs; None without prlimit.

    Why not a preexec function: it makes Python fork() instead of vfork(), and fork
    copies the page tables of the agent's process. Holding the default model (1.6 GB
    resident) that cost 65 ms a command, against under 3 ms for this launcher."""
    prlimit = _prlimit()
    if prlimit is None or not os.path.exists("/bin/sh"):
        return None

    def value(number: int) -> str:
        return "unlimited" if number == resource.RLIM_INFINITY else str(number)

    flags = [
        f"{_PRLIMIT_FLAGS[kind]}={value(soft)}:{value(hard)}"
        for kind, (soft, hard) in _rlimit_settings(limits, nproc)
    ]
    procs = os.fsdecode(cgroup.procs_path) if cgroup is not None else ""
    return ["/bin/sh", "-c", _LAUNCHER, "resident-limits", procs, prlimit, *flags, "--", *argv]


def rlimit_setter(limits: Limits, nproc: int | None, cgroup: PidsCgroup | None):
    """The function the child runs between fork and exec (where prlimit is missing);
    everything it needs is computed here, in the parent, so the child only makes
    system calls."""
    settings = _rlimit_settings(limits, nproc)

    def apply() -> None:
        if cgroup is not None:
            cgroup.join()
        for kind, values in settings:
            resource.setrlimit(kind, values)

    return apply
