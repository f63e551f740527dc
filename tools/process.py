"""Run a command as its own process group, with a timeout, an output cap and an off switch.

The command becomes the leader of a new session (so of a new process
group); stopping it signals the whole group, so children and grandchildren
go with it: SIGTERM first, SIGKILL after a grace period for those that
ignore it. When the leader exits on its own, whatever it left running in
the background is killed too, since it would otherwise hold the output pipe
open and outlive the tool call. (A process that calls setsid() itself leaves
the group; only a cgroup or container could hold it.)
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.output_cap import HeadTailBuffer

_POLL_S = 0.05
# After the group is gone, how long to wait for the pipe to close (a process
# that escaped the group may hold it).
_DRAIN_S = 0.5


@dataclass(frozen=True)
class ProcessOutcome:
    exit_code: int | None  # None when the process was killed by a signal
    signal: int | None
    output: str
    truncated: bool
    omitted_bytes: int
    timed_out: bool
    cancelled: bool
    duration_s: float

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.cancelled


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
    many exist now; it never raises the current hard limit. (Tasks of the same
    uid in other PID namespaces are invisible here and count against it too.)
    """
    current = user_task_count()
    if current is None or budget <= 0:
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    wanted = current + budget
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _limits_setter(nproc: int | None):
    def apply() -> None:  # runs in the child between fork and exec: keep it tiny
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    output_limit: int,
    cancel_event: threading.Event | None = None,
    process_budget: int = 0,
    kill_grace_s: float = 2.0,
) -> ProcessOutcome:
    """Run `argv` to completion, timeout or cancellation; stdout and stderr interleaved."""
    started = time.monotonic()
    buffer = HeadTailBuffer(output_limit)
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        preexec_fn=_limits_setter(process_limit(process_budget)),
    )
    pgid = process.pid  # the leader of a new session: its pid is the group id
    assert process.stdout is not None
    stream = process.stdout
    os.set_blocking(stream.fileno(), False)
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    deadline = started + timeout_s
    timed_out = cancelled = False
    term_sent_at: float | None = None
    drain_until: float | None = None
    try:
        while True:
            end_of_output = any(
                not _read_available(stream, buffer) for _ in selector.select(_POLL_S)
            )
            if end_of_output:
                break  # every writer is gone
            now = time.monotonic()
            if term_sent_at is None:
                if now >= deadline:
                    timed_out = True
                elif cancel_event is not None and cancel_event.is_set():
                    cancelled = True
                if timed_out or cancelled or process.poll() is not None:
                    # Stopping it, or it is done: either way the group goes now.
                    if process.poll() is None:
                        _signal_group(pgid, signal.SIGTERM)
                        term_sent_at = now
                    else:
                        _signal_group(pgid, signal.SIGKILL)
                        term_sent_at = now - kill_grace_s
            elif now - term_sent_at >= kill_grace_s:
                _signal_group(pgid, signal.SIGKILL)
                if process.poll() is not None:
                    if drain_until is None:
                        drain_until = now + _DRAIN_S
                    elif now >= drain_until:
                        break
    finally:
        if process.poll() is None:
            _signal_group(pgid, signal.SIGKILL)
        process.wait()
        selector.close()
        stream.close()
    code = process.returncode
    return ProcessOutcome(
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        output=buffer.render(),
        truncated=buffer.truncated,
        omitted_bytes=buffer.omitted,
        timed_out=timed_out,
        cancelled=cancelled,
        duration_s=time.monotonic() - started,
    )


def _read_available(stream, buffer: HeadTailBuffer, max_chunks: int = 64) -> bool:
    """Read what the pipe holds now (bounded, so a flood cannot starve the timeout
    checks); False at end of file."""
    for _ in range(max_chunks):
        try:
            chunk = os.read(stream.fileno(), 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        buffer.feed(chunk)
    return True
