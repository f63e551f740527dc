"""Files in hostile shapes, and ways to read them that fail instead of hanging.

A repository (or a model that can write files) can put, where Resident reads
a small text file, a link to /dev/zero (endless), a FIFO (an open that waits
for a writer) or a file far over any sensible size. Tests give each reader
each shape and check it answers with a clear problem, never a hang:

- `finishes` runs a call in a thread with a deadline: enough for a FIFO (a
  blocked open holds no memory) and an over-size file;
- `run_isolated` runs Python in a child with a deadline and an address-space
  limit: a reader that reads /dev/zero whole fails there with MemoryError or
  is killed at the deadline, instead of filling this machine's memory.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ("dev_zero", "fifo", "oversize")
# Sparse, so the test costs no disk: far above every cap Resident uses.
OVERSIZE_BYTES = 64 * 1024 * 1024
CHILD_MEMORY_BYTES = 3 * 1024**3
T = TypeVar("T")


def make_hostile(path: Path, shape: str) -> None:
    """Put a file of `shape` at `path` (its folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if shape == "dev_zero":
        path.symlink_to("/dev/zero")
    elif shape == "fifo":
        os.mkfifo(path)
    elif shape == "oversize":
        with path.open("wb") as handle:
            handle.write(b'{"hooks": {}, "mcpServers": {}}\n')
            handle.truncate(OVERSIZE_BYTES)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def unblock(path: Path) -> None:
    """Let a reader stuck opening the FIFO at `path` go on (it then reads nothing)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # no reader waiting, or not a FIFO
    os.close(fd)


def finishes(function: Callable[[], T], seconds: float = 10.0, fifo: Path | None = None) -> T:
    """`function()`, run in a daemon thread; the test fails if it takes over `seconds`.
    `fifo`: a FIFO the call may be stuck on, opened afterwards so the thread can end."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:  # re-raised in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            unblock(fifo)
        pytest.fail(f"the read did not finish in {seconds:g} s (it hangs)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))


def run_isolated(
    arguments: list[str], *, env: dict[str, str] | None = None, seconds: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`python ARGUMENTS` from the repository root, with a deadline and a memory limit;
    the test fails if it runs past the deadline."""
    try:
        return subprocess.run(
            [sys.executable, *arguments],
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=seconds,
            preexec_fn=_limit_memory,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"python {' '.join(arguments)[:200]} did not finish in {seconds:g} s (it hangs)"
        )
