"""Process exit codes: what a task's outcome means to a shell, for the front ends that exit.

The core reports why a task ended (`TaskOutcome.reason`, and for a failure
the client error's `kind`); a process exit code is a front end's business,
so the mapping lives here, shared by `resident run`, the line REPL and the
TUI. The codes are the public contract of `resident run` (DESIGN.md §2).
"""

from __future__ import annotations

from agent.core.loop import TaskOutcome

EXIT_DONE = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_APPROVAL = 3
EXIT_TEMPORARY = 75  # sysexits' EX_TEMPFAIL: unreachable or overloaded, try again later
EXIT_INTERRUPTED = 130

_BY_REASON = {
    "done": EXIT_DONE,
    "max_turns": EXIT_FAILED,
    "failed": EXIT_FAILED,
    "approval": EXIT_APPROVAL,
    "blocked": EXIT_FAILED,  # a user_prompt hook refused the task
    "interrupted": EXIT_INTERRUPTED,
}
# Client error kinds (agent/core/clients/base.py) that are not plain failures.
_BY_ERROR_KIND = {"transient": EXIT_TEMPORARY, "configuration": EXIT_USAGE, "usage": EXIT_USAGE}


def error_exit_code(kind: str) -> int:
    """The exit code for a failure of this kind (a client error's `kind`)."""
    return _BY_ERROR_KIND.get(kind, EXIT_FAILED)


def exit_code(outcome: TaskOutcome) -> int:
    if outcome.reason == "failed" and outcome.error_kind is not None:
        return error_exit_code(outcome.error_kind)
    return _BY_REASON.get(outcome.reason, EXIT_FAILED)
