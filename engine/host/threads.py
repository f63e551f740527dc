"""The engine's compute-thread policy: one OpenMP team, owned by the thread that steps.

torch and the engine's C kernels share one OpenMP runtime (libgomp). libgomp
keeps a pool of worker threads for every thread that has ever started a
parallel region, and counts all of them; once that count passes the cores the
process may use, every team stops spinning at its barriers and sleeps on a
futex instead, and each wake-up costs tens of microseconds on a VM. A decode
step has hundreds of barriers. Measured on 2 cores (AMD Zen 5 under KVM;
docs/BENCHMARKS.md, issue 25): the default model decodes about 230 tok/s
stepped from the thread that loaded it, and about 70 tok/s stepped from
another thread once the loading thread holds a pool, which is the server's
shape (loaded on the main thread, stepped on the engine thread) and the
agent's. `resident bench serving` measures every path side by side.

So the policy, applied by `AsyncEngine` (the library's `LLM` steps on its
caller's thread and needs none of it):
- the engine's kernels run on torch's thread count, capped at the cores this
  process may run on (affinity and cgroup quota: `fit_to_usable_cores`), and
  the thread that steps the engine claims that count for its team;
- every other thread that has done torch work (the one that loaded the model,
  the event loop, the TUI) hands its pool back and runs one thread from then on
  (`quiet_this_thread`), as do threads started later (torch's default).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the threads, not only park them
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 `cpu` controller path, from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _read_limit(quota_file: Path, period_file: Path | None) -> float | None:
    try:
        if period_file is None:  # v2: "QUOTA PERIOD" in one file, QUOTA "max" for none
            quota, period = quota_file.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        quota = int(quota_file.read_text())
        return None if quota <= 0 else quota / int(period_file.read_text())
    except (OSError, ValueError):
        return None


def _cgroup_cpu_limit(root: Path = _CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """CPUs per period this process's cgroup (or any cgroup above it) may use, or None."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    v2, v1 = _cgroup_paths(proc_cgroup)
    limits = []
    for relative, base, files in (
        (v2, root, ("cpu.max", None)),
        (v1, root / "cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us")),
    ):
        if relative is None:
            continue
        folder = base / relative.lstrip("/")
        while True:  # a quota anywhere above the process applies to it too
            period = folder / files[1] if files[1] else None
            limit = _read_limit(folder / files[0], period)
            if limit is not None:
                limits.append(limit)
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(limits) if limits else None


def usable_cores(cgroup_root: Path = _CGROUP_ROOT, proc_cgroup: str | None = None) -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit(cgroup_root, proc_cgroup)
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


def fit_to_usable_cores() -> int:
    """Cap this thread's torch threads at the usable cores and return the count.

    torch's default is the machine's physical cores (or `OMP_NUM_THREADS`), blind to
    affinity and cgroup quotas: in a container given 2 of 64 cores its 64 threads
    would take turns on 2. A smaller count the user chose stays."""
    threads, cores = torch.get_num_threads(), usable_cores()
    if threads > cores:
        log.info("compute threads %d -> %d: the cores this process may use", threads, cores)
        torch.set_num_threads(cores)
    return min(threads, cores)


@functools.cache
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (found in this process's maps), or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libgomp" in Path(path).name or "libiomp" in Path(path).name:
            try:
                return ctypes.CDLL(path)
            except OSError:
                return None
    return None


def release_pool() -> bool:
    """Free the calling thread's OpenMP worker threads, so they no longer count against
    the engine's team. False when the runtime has no such call (or none is loaded)."""
    runtime = _openmp()
    pause = getattr(runtime, "omp_pause_resource_all", None)
    if pause is None:
        return False
    pause.argtypes = [ctypes.c_int]
    return pause(_OMP_PAUSE_HARD) == 0


def claim_compute_threads(threads: int) -> None:
    """On the thread that steps the engine: run its kernels on `threads` threads.

    torch gives each thread its count lazily, from the last count set anywhere, on
    the thread's first query; asking first makes that happen now, so a later
    `quiet_this_thread` elsewhere cannot reach this thread. Call it before any
    other thread is quieted."""
    torch.get_num_threads()
    torch.set_num_threads(threads)


def quiet_this_thread() -> int:
    """On any thread but the engine's: hand back its OpenMP pool and run one thread.

    Returns the thread count it had, for `restore_this_thread`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    if not release_pool():
        log.debug("no omp_pause_resource_all in this OpenMP runtime; its pool stays")
    return before


def restore_this_thread(threads: int) -> None:
    torch.set_num_threads(threads)
