"""`resident run`: one task, no questions, an exit code a script can act on.

Exit codes (DESIGN.md §2): 0 done, 1 failed, 2 usage error, 3 needed an
approval nobody could give, 75 transient (engine unreachable or overloaded),
130 interrupted. Ctrl-C once stops the task cleanly (generation aborted, a
running command killed, the history kept consistent); twice stops at once.
The task `/compact` compacts the resumed session's conversation instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, replace
from typing import TextIO

from agent.core.clients import ClientError, LLMClient
from agent.core.events import ErrorEvent, EventEmitter, SessionCompleted
from agent.core.loop import TaskOutcome
from agent.core.runtime import Runtime, RuntimeOptions, UnknownToolError, open_runtime
from agent.core.session import SessionNotFound
from agent.event_printers import JsonLinesPrinter, ProgressPrinter
from agent.exit_codes import EXIT_DONE, EXIT_USAGE, error_exit_code, exit_code
from tools.sandbox.bubblewrap import SandboxUnavailable

# What a headless run can do about a call that needed a person's approval.
APPROVAL_ADVICE = " Run again with --approval auto-edit or full-auto, or in the TUI to approve it."

COMPACT_COMMAND = "/compact"


@dataclass
class HeadlessOptions:
    task: str
    runtime: RuntimeOptions
    json: bool = False


def _same_terminal(out: TextIO, err: TextIO) -> bool:
    try:
        a, b = os.fstat(out.fileno()), os.fstat(err.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return out.isatty() and err.isatty() and os.path.samestat(a, b)


def _fail_before_start(
    message: str, kind: str, code: int, out: TextIO, err: TextIO, as_json: bool
) -> int:
    """Report a failure that came before any session existed, in the run's own format."""
    if as_json:
        emitter = EventEmitter([JsonLinesPrinter(out)])
        emitter.emit(ErrorEvent(message=message, kind=kind, fatal=True))
        emitter.emit(SessionCompleted(final_message=message, exit_code=code))
    err.write(f"error: {message}\n")
    err.flush()
    return code


async def _run_task(runtime: Runtime, task: str) -> TaskOutcome:
    if task.strip() == COMPACT_COMMAND:
        done = await runtime.agent.compact()
        if done:
            return TaskOutcome("Compacted the conversation.", "done")
        return TaskOutcome("Nothing was compacted.", "failed")
    return await runtime.agent.run_task(task)


def _install_interrupt(runtime: Runtime, main: asyncio.Task) -> None:
    loop = asyncio.get_running_loop()
    presses = 0

    def on_interrupt() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            runtime.agent.interrupt()
        else:
            main.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGINT, on_interrupt)


async def run_headless_async(
    options: HeadlessOptions,
    out: TextIO | None = None,
    err: TextIO | None = None,
    client: LLMClient | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    printer = JsonLinesPrinter(out) if options.json else ProgressPrinter(err)
    try:
        runtime = await open_runtime(options.runtime, [printer], None, client, options.task)
    except ClientError as problem:
        return _fail_before_start(
            str(problem), problem.kind, error_exit_code(problem.kind), out, err, options.json
        )
    except (SessionNotFound, UnknownToolError) as problem:
        return _fail_before_start(str(problem), "usage", EXIT_USAGE, out, err, options.json)
    if isinstance(runtime.sandbox, SandboxUnavailable):
        reason = runtime.sandbox.reason
        err.write(f"warning: no sandbox ({reason}); every shell command needs approval\n")
        err.flush()
    main = asyncio.current_task()
    if main is not None:
        _install_interrupt(runtime, main)
    try:
        outcome = await _run_task(runtime, options.task)
    except asyncio.CancelledError:
        outcome = TaskOutcome("Interrupted.", "interrupted")
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    if outcome.reason == "approval":
        outcome = replace(outcome, final_message=outcome.final_message + APPROVAL_ADVICE)
    code = exit_code(outcome)
    runtime.emitter.emit(SessionCompleted(final_message=outcome.final_message, exit_code=code))
    await runtime.close()
    if not options.json and not (code == EXIT_DONE and _same_terminal(out, err)):
        # On one terminal the streamed text already showed the answer; a pipe still gets it.
        out.write(outcome.final_message.rstrip("\n") + "\n")
        out.flush()
    return code


def run_headless(options: HeadlessOptions, client: LLMClient | None = None) -> int:
    return asyncio.run(run_headless_async(options, client=client))
