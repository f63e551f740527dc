"""Process helpers for the tensor-parallel tests: free ports, children by PID, servers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


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


def wait_until(condition, timeout: float, what: str, poll: float = 0.1):
    """Poll `condition` until it returns something true; fail (not hang) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def resident_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "resident"), *args]


def start(command: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "RESIDENT_API_KEY": ""}
    with log_path.open("w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_healthy(process: subprocess.Popen, url: str, log_path: Path, timeout: float = 120):
    def healthy() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, timeout, f"{url}/health\n{log_path.read_text()}", poll=0.25)


def stop(process: subprocess.Popen, timeout: float = 30) -> int:
    """SIGTERM by PID, then SIGKILL if it does not exit; returns the exit code."""
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
