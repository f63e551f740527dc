"""Run a command as its own process group, with a timeout, an output cap and an off switch.

The command becomes the leader of a new session (so of a new process
group); stopping it signals the whole group, so children and grandchildren
go with it: SIGTERM first, SIGKILL after a grace period for those that
ignore it. When the leader exits on its own, whatever it left running in
the background is killed too, since it would otherwise hold the output pipe
open and outlive the tool call. A process that calls setsid() itself leaves
the group: the sandbox's PID namespace, or the command's own cgroup where
one can be made (tools.process.limits), still reaches it.

The exit status is the leader's: its output pipe can reach end-of-file a
moment before the kernel lets it be reaped, so end of output means "wait
for the leader", never "kill it".
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.process.group import leader_exited, read_available, signal_group
from tools.process.limits import (
    Limits,
    PidsCgroup,
    limited_argv,
    process_limit,
    rlimit_setter,
    user_task_count,
)
from tools.process.output_cap import HeadTailBuffer

__all__ = ["ProcessOutcome", "process_limit", "run_process", "user_task_count"]

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
    limits: Limits | None = None,
) -> ProcessOutcome:
    """Run `argv` to completion, timeout or cancellation; stdout and stderr interleaved.
    `process_budget` caps the processes it may start (a cgroup where one can be made,
    else RLIMIT_NPROC); `limits` adds CPU-time and file-size limits."""
    limits = limits or Limits()
    cgroup = PidsCgroup.create(process_budget) if process_budget > 0 else None
    nproc = None if cgroup is not None else process_limit(process_budget)
    launched = limited_argv(argv, limits, nproc, cgroup)
    preexec = rlimit_setter(limits, nproc, cgroup) if launched is None else None
    try:
        return _run(launched or argv, cwd, env, timeout_s, output_limit, cancel_event,
                    kill_grace_s, preexec)  # fmt: skip
    finally:
        if cgroup is not None:
            cgroup.remove()


def _run(argv, cwd, env, timeout_s, output_limit, cancel_event, kill_grace_s, preexec):
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
        preexec_fn=preexec,
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
                not read_available(stream, buffer) for _ in selector.select(_POLL_S)
            )
            if end_of_output:
                break  # every writer is gone; the leader may still be running
            now = time.monotonic()
            if term_sent_at is None:
                if now >= deadline:
                    timed_out = True
                elif cancel_event is not None and cancel_event.is_set():
                    cancelled = True
                if timed_out or cancelled:
                    signal_group(pgid, signal.SIGTERM)
                    term_sent_at = now
                elif leader_exited(process):
                    # Done, but something it started holds the pipe: that goes now.
                    signal_group(pgid, signal.SIGKILL)
                    term_sent_at = now - kill_grace_s
            elif now - term_sent_at >= kill_grace_s:
                signal_group(pgid, signal.SIGKILL)
                if leader_exited(process):
                    if drain_until is None:
                        drain_until = now + _DRAIN_S
                    elif now >= drain_until:
                        break
        if term_sent_at is None:
            timed_out, cancelled = _wait_for_leader(process, deadline, cancel_event)
            if timed_out or cancelled:
                signal_group(pgid, signal.SIGTERM)
                _wait_for_leader(process, time.monotonic() + kill_grace_s, None)
    finally:
        # The leader is not reaped before this, so its group id cannot have been
        # reused: signalling the group reaches only what the command started.
        signal_group(pgid, signal.SIGKILL)
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


def _wait_for_leader(
    process: subprocess.Popen, deadline: float, cancel_event: threading.Event | None
) -> tuple[bool, bool]:
    """Wait for the leader after its output closed: (timed out, cancelled)."""
    while True:
        if leader_exited(process):
            return False, False
        time.sleep(0.005)
        if time.monotonic() >= deadline:
            return True, False
        if cancel_event is not None and cancel_event.is_set():
            return False, True
