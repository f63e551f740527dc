"""Process helpers for the tensor-parallel tests: free ports, children by PID, servers, and
time limits that scale with how busy the machine is."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

# A time limit here is there to turn a hang into a failure, never to measure speed:
# each is what the step takes on an idle 2-core machine times SLOWDOWN, and more
# while the machine runs more than it has cores for (two test processes at once
# make every step about twice as slow). RESIDENT_TEST_SLOWDOWN raises it further.
SLOWDOWN = float(os.environ.get("RESIDENT_TEST_SLOWDOWN", "10"))


def patience(idle_seconds: float) -> float:
    """A time limit for something that takes about `idle_seconds` on an idle machine."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    busy = os.getloadavg()[0] / cores
    return idle_seconds * SLOWDOWN * max(1.0, busy)


def free_port(*taken: int) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def is_running(pid: int) -> bool:
    """Alive and not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> list[int]:
    """The running processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.append(int(entry.name))
    return found


def spawned_workers(pid: int) -> list[int]:
    """The worker ranks `pid` started: its children that multiprocessing spawned
    (not its resource tracker)."""
    found = []
    for child in children(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"spawn_main" in command:
            found.append(child)
    return found


def wait_until(condition, timeout: float, what, poll: float = 0.1):
    """Poll `condition` until it returns something true; fail (not hang) after `timeout`.
    `what` names what was awaited: a string, or a function giving one when it fails."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(poll)


def resident_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "resident"), *args]


def start(command: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "RESIDENT_API_KEY": ""}
    with log_path.open("w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


@contextmanager
def running(command: list[str], log_path: Path) -> Iterator[subprocess.Popen]:
    """A process (`resident serve`, a node) that is stopped by PID on the way out however
    the test ended, and what it started (its worker ranks, multiprocessing's resource
    tracker) killed if it outlived it."""
    process = start(command, log_path)
    try:
        yield process
    finally:
        started = children(process.pid) if process.poll() is None else []
        stop(process)
        kill_all(started)


def wait_healthy(process: subprocess.Popen, url: str, log_path: Path, timeout: float | None = None):
    """`resident serve` answering /health; it starts in about 10 s on an idle machine."""

    def healthy() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    limit = patience(12) if timeout is None else timeout
    wait_until(healthy, limit, lambda: f"{url}/health\n{log_path.read_text()}", poll=0.25)


def stop(process: subprocess.Popen, timeout: float | None = None) -> int:
    """SIGTERM by PID, then SIGKILL if it does not exit; returns the exit code."""
    timeout = patience(3) if timeout is None else timeout
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(timeout=timeout)


def kill_all(pids: list[int]) -> None:
    """Clean-up after a failed test: nothing it started may outlive it."""
    for pid in pids:
        if is_running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
