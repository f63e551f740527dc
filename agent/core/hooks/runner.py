"""Running one hook: its command line, sandboxed or not, the event on stdin, a timeout, caps.

A hook is `/bin/sh -c COMMAND` in the workspace, with the event as one JSON
object on stdin; stdout and stderr are read apart (stdout may carry context
for the model, stderr the reason for a block), each capped to its head and
tail. The command leads a new session, so a timeout or an interrupt stops
its whole process group: SIGTERM, then SIGKILL after a grace period. When
the leader exits, whatever it left running goes too (it would hold the
pipes open and outlive the hook). A sandboxed hook runs under bubblewrap,
which is that group's leader: its PID namespace takes every process of the
hook with it, including ones that called setsid().

The process is watched from a worker thread, so the agent's event loop
never blocks on a hook; the group is never signalled after its leader has
been reaped, so the signal cannot reach a process that reused the id.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.hooks.config import Hook
from tools.process.environment import command_environment
from tools.process.group import leader_exited, read_available, signal_group
from tools.process.output_cap import HeadTailBuffer
from tools.sandbox.grants import CommandSandbox, SandboxError, SandboxGrant, SandboxSettings

OUTPUT_LIMIT = 16 * 1024  # bytes kept of stdout, and of stderr
KILL_GRACE_S = 1.0
# After the leader exits, how long what it started may keep the pipes open.
LEFTOVER_S = 0.3
_POLL_S = 0.05
_CHUNK = 1 << 16


@dataclass(frozen=True)
class HookResult:
    exit_code: int | None  # None: it did not start, or a signal ended it
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    cancelled: bool = False
    signal: int | None = None
    error: str | None = None  # why it did not start
    truncated: bool = False  # stdout or stderr lost its middle


@dataclass(frozen=True)
class Confinement:
    """How a hook runs: unconfined (the user's own), or in the sandbox with a grant."""

    sandbox: CommandSandbox | None = None
    grant: SandboxGrant = SandboxGrant()
    settings: SandboxSettings = SandboxSettings()


def hook_command(
    hook: Hook,
    workspace: Path,
    confinement: Confinement,
    variables: Mapping[str, str],
    base_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment for `hook`. Raises SandboxError when the sandbox
    cannot wrap it.

    Unconfined, a hook gets the agent's environment (credential variables already
    left it at start, agent/core/process_guard.py), as a command the user typed
    would. Sandboxed, it gets the allow-list shell commands get."""
    base = dict(os.environ if base_env is None else base_env)
    argv = ["/bin/sh", "-c", hook.command]
    if confinement.sandbox is None:
        return argv, {**base, **variables}
    settings = confinement.settings
    env = command_environment(
        base,
        home=base.get("HOME") or os.path.expanduser("~"),
        tmpdir="/tmp",
        extra_names=settings.env_names,
        extra=variables,
    )
    wrapped = confinement.sandbox.wrap(
        argv,
        workspace=workspace,
        cwd=workspace,
        grant=confinement.grant,
        env=base,
        settings=settings,
    )
    return wrapped, env


async def run_hook(
    hook: Hook,
    workspace: Path,
    confinement: Confinement,
    stdin: bytes,
    variables: Mapping[str, str],
    cancel: threading.Event | None = None,
) -> HookResult:
    """Run `hook` to its end, its timeout or `cancel`; never raises for the hook's faults."""
    try:
        argv, env = hook_command(hook, workspace, confinement, variables)
    except SandboxError as err:
        return HookResult(None, "", "", 0.0, error=f"the sandbox refused it: {err}")
    stop = threading.Event()
    watch = _Watch(stop, cancel)
    try:
        return await asyncio.to_thread(
            run_hook_process, argv, cwd=workspace, env=env, stdin=stdin,
            timeout_s=hook.timeout, cancel=watch,
        )  # fmt: skip
    except asyncio.CancelledError:  # the agent's task is torn down: the hook goes too
        stop.set()
        raise


class _Watch:
    """Set when either event is: the agent's interrupt, or this run being torn down."""

    def __init__(self, own: threading.Event, other: threading.Event | None) -> None:
        self._own = own
        self._other = other

    def is_set(self) -> bool:
        return self._own.is_set() or (self._other is not None and self._other.is_set())


def run_hook_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bytes,
    timeout_s: float,
    cancel: threading.Event | _Watch | None = None,
    output_limit: int = OUTPUT_LIMIT,
    kill_grace_s: float = KILL_GRACE_S,
) -> HookResult:
    """Blocking: run `argv` in its own session, feed `stdin`, collect both streams."""
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )  # fmt: skip
    except OSError as err:
        return HookResult(None, "", "", time.monotonic() - started, error=f"cannot start: {err}")
    assert process.stdin and process.stdout and process.stderr
    out, err = HeadTailBuffer(output_limit), HeadTailBuffer(output_limit)
    io = _Pipes(process, stdin, out, err)
    timed_out = cancelled = False
    try:
        timed_out, cancelled = _supervise(process, io, started + timeout_s, cancel, kill_grace_s)
    finally:
        # The leader is not reaped yet, so its group id is still its own.
        signal_group(process.pid, signal.SIGKILL)
        process.wait()
        io.close()
    code = process.returncode
    return HookResult(
        exit_code=code if code >= 0 else None,
        stdout=out.render(),
        stderr=err.render(),
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
        cancelled=cancelled,
        signal=-code if code < 0 else None,
        truncated=out.truncated or err.truncated,
    )


def _supervise(process, io: _Pipes, deadline, cancel, kill_grace_s) -> tuple[bool, bool]:
    """Pump the pipes until the hook is over: (timed out, cancelled)."""
    timed_out = cancelled = False
    term_sent_at: float | None = None
    exited_at: float | None = None
    while True:
        io.pump(_POLL_S)
        now = time.monotonic()
        exited = leader_exited(process)
        if exited and exited_at is None:
            exited_at = now
        if exited and (io.drained or now - exited_at >= LEFTOVER_S):
            return timed_out, cancelled  # leftovers holding the pipes die in the caller
        if term_sent_at is None:
            if now >= deadline:
                timed_out = True
            elif cancel is not None and cancel.is_set():
                cancelled = True
            if timed_out or cancelled:
                signal_group(process.pid, signal.SIGTERM)
                term_sent_at = now
        elif now - term_sent_at >= kill_grace_s:
            signal_group(process.pid, signal.SIGKILL)


class _Pipes:
    """The hook's stdin (written as it accepts) and its stdout and stderr (read into caps)."""

    def __init__(self, process, data: bytes, out: HeadTailBuffer, err: HeadTailBuffer) -> None:
        self.selector = selectors.DefaultSelector()
        self.pending = memoryview(data)
        self.reading = 0
        for stream, buffer in ((process.stdout, out), (process.stderr, err)):
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream, selectors.EVENT_READ, buffer)
            self.reading += 1
        self.stdin = process.stdin
        os.set_blocking(self.stdin.fileno(), False)
        if self.pending:
            self.selector.register(self.stdin, selectors.EVENT_WRITE)
        else:
            self._close_stdin()
        self._streams = [process.stdout, process.stderr]

    @property
    def drained(self) -> bool:
        return self.reading == 0

    def pump(self, timeout: float) -> None:
        if not self.selector.get_map():
            time.sleep(timeout)
            return
        for key, _ in self.selector.select(timeout):
            if key.fileobj is self.stdin:
                self._write()
            elif not read_available(key.fileobj, key.data, max_chunks=16):
                self.selector.unregister(key.fileobj)
                self.reading -= 1

    def _write(self) -> None:
        try:
            written = os.write(self.stdin.fileno(), self.pending[:_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # the hook closed its stdin or exited without reading it
            written = len(self.pending)
        self.pending = self.pending[written:]
        if not self.pending:
            self.selector.unregister(self.stdin)
            self._close_stdin()

    def _close_stdin(self) -> None:
        try:
            self.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        self.selector.close()
        self._close_stdin()
        for stream in self._streams:
            stream.close()
