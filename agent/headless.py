"""`resident run`: one task, no questions, an exit code a script can act on.

Exit codes (DESIGN.md §2): 0 done, 1 failed, 2 usage error, 3 needed an
approval nobody could give, 75 transient (engine unreachable or overloaded),
130 interrupted. Ctrl-C once stops the task cleanly (generation aborted, a
running command killed, the history kept consistent); twice stops at once.
The task `/compact` compacts the resumed session's conversation instead; a
task `/NAME args` naming a custom command (agent/core/custom_commands.py)
runs its expansion.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from agent.core.clients import ClientError, LLMClient
from agent.core.custom_commands import CustomCommands, Invocation
from agent.core.events import ErrorEvent, EventEmitter, SessionCompleted
from agent.core.loop import TaskOutcome
from agent.core.runtime import Runtime, RuntimeOptions, UnknownToolError, open_runtime
from agent.core.session import SessionNotFound
from agent.event_printers import JsonLinesPrinter, ProgressPrinter
from agent.exit_codes import EXIT_DONE, EXIT_USAGE, error_exit_code, exit_code
from agent.terminal_text import terminal_safe
from tools.sandbox.bubblewrap import SandboxUnavailable

# What a headless run can do about a call that needed a person's approval.
APPROVAL_ADVICE = " Run again with --approval auto-edit or full-auto, or in the TUI to approve it."
# How to carry out a plan that `--approval plan` proposed: its session, another mode.
PLAN_ADVICE = (
    "To carry out the plan: resident run --resume {session} --approval auto-edit "
    '"Carry out the plan." (or full-auto, or ask in the TUI: resident --resume {session})\n'
)

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
    err.write(terminal_safe(f"error: {message}") + "\n")
    err.flush()
    return code


async def _run_task(runtime: Runtime, task: str, custom: Invocation | None) -> TaskOutcome:
    if task.strip() == COMPACT_COMMAND:
        done = await runtime.agent.compact()
        if done:
            return TaskOutcome("Compacted the conversation.", "done")
        return TaskOutcome("Nothing was compacted.", "failed")
    if custom is not None:
        return await runtime.agent.run_task(custom.prompt, custom.typed)
    return await runtime.agent.run_task(task)


def _custom_command(options: HeadlessOptions, err: TextIO) -> Invocation | None:
    """The task as a custom command, if it is one; what is wrong with the command
    files goes to stderr as warnings."""
    commands = CustomCommands(Path(options.runtime.workspace))
    discovery = commands.discover()
    for problem in discovery.problems:  # they name the repository's files
        err.write(terminal_safe(f"warning: {problem}") + "\n")
    err.flush()
    return commands.invocation(options.task, discovery)


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
    custom = _custom_command(options, err)
    # The expansion, not `/NAME`, is what the snapshot's ranking and the title go by.
    task = custom.prompt if custom is not None else options.task
    try:
        runtime = await open_runtime(options.runtime, [printer], None, client, task)
    except ClientError as problem:
        return _fail_before_start(
            str(problem), problem.kind, error_exit_code(problem.kind), out, err, options.json
        )
    except (SessionNotFound, UnknownToolError) as problem:
        return _fail_before_start(str(problem), "usage", EXIT_USAGE, out, err, options.json)
    if isinstance(runtime.sandbox, SandboxUnavailable):
        reason = runtime.sandbox.reason
        warning = f"warning: no sandbox ({reason}); every shell command needs approval"
        err.write(terminal_safe(warning) + "\n")
        err.flush()
    main = asyncio.current_task()
    if main is not None:
        _install_interrupt(runtime, main)
    try:
        outcome = await _run_task(runtime, options.task, custom)
    except asyncio.CancelledError:
        outcome = TaskOutcome("Interrupted.", "interrupted")
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    if outcome.reason == "approval":
        outcome = replace(outcome, final_message=outcome.final_message + APPROVAL_ADVICE)
    code = exit_code(outcome)
    if outcome.plan and not options.json:
        err.write(PLAN_ADVICE.format(session=runtime.session.id))
        err.flush()
    runtime.emitter.emit(SessionCompleted(final_message=outcome.final_message, exit_code=code))
    await runtime.close()
    if not options.json and not (code == EXIT_DONE and _same_terminal(out, err)):
        # On one terminal the streamed text already showed the answer; a pipe still gets it,
        # shown as safely as the stream was (--json carries the exact text).
        out.write(terminal_safe(outcome.final_message.rstrip("\n")) + "\n")
        out.flush()
    return code


def run_headless(options: HeadlessOptions, client: LLMClient | None = None) -> int:
    return asyncio.run(run_headless_async(options, client=client))
