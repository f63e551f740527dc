"""Long-lived child processes whose peak memory is measured: each engine of `resident bench
families` runs in its own process, so its peak resident set is its own.

The peak is the child's VmHWM (/proc/PID/status), read just before it is
stopped. Not `wait4`'s or `getrusage`'s ru_maxrss: Linux carries the address
space's high-water mark across exec, and a child is forked from this process
(a Python holding torch), so its ru_maxrss would be at least the parent's.
Output goes to a temporary file, not a pipe, so a chatty child never stalls on
a full pipe (the Resident worker's command channel is the one pipe, read line
by line).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

_STOP_GRACE_S = 30.0


def peak_rss_bytes(pid: int) -> int | None:
    """The process's peak resident set since its exec (VmHWM), or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    return None


class Running:
    """A child started in its own session (a server, the Resident worker); `stop()` ends
    it and returns its peak RSS. stdin and stdout are text pipes only when asked for."""

    def __init__(self, command: list[str], env: dict | None = None, pipes: bool = False):
        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if pipes else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipes else self._log,
            stderr=self._log,
            env=env,
            start_new_session=True,
            text=pipes,
        )
        self.peak_rss_bytes: int | None = None
        self._stopped = False

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def stop(self) -> int | None:
        """Read the child's peak RSS, then SIGTERM its group (SIGKILL after a grace period)."""
        if self._stopped:
            return self.peak_rss_bytes
        self._stopped = True
        self.peak_rss_bytes = peak_rss_bytes(self.process.pid)
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()
        return self.peak_rss_bytes

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
