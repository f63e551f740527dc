"""The `shell` tool: run a bash command in the workspace, bounded in time, output and processes."""

from __future__ import annotations

import shutil

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.environment import scrubbed_environment
from tools.paths import PathError, resolve_path
from tools.process import ProcessOutcome, run_process


class ShellArgs(Arguments):
    command: str = Field(min_length=1, description="The bash command line to run.")
    timeout_s: float | None = Field(
        default=None, gt=0, description="Seconds before the command is killed (default 120)."
    )
    workdir: str | None = Field(
        default=None, description="Directory to run in, relative to the workspace (default: root)."
    )


def bash_path() -> str:
    return shutil.which("bash") or "/bin/sh"


def describe_outcome(outcome: ProcessOutcome, timeout_s: float) -> str:
    if outcome.timed_out:
        return f"[timed out after {timeout_s:g}s; the command and its children were killed]"
    if outcome.cancelled:
        return "[interrupted; the command and its children were killed]"
    if outcome.signal is not None:
        return f"[killed by signal {outcome.signal}]"
    return f"[exit code {outcome.exit_code}]"


class ShellTool(Tool):
    name = "shell"
    description = (
        "Run a bash command in the workspace (non-interactive: no stdin, no pager). "
        "Long output keeps its beginning and end. The command and everything it starts "
        "are killed at the timeout; background processes do not outlive the call."
    )
    effect = Effect.EXECUTE
    Args = ShellArgs

    def access(self, args: ShellArgs) -> ToolAccess:
        paths = (args.workdir,) if args.workdir else ()
        return ToolAccess(
            effect=self.effect, summary=f"Run: {args.command}", paths=paths, command=args.command
        )

    def run(self, args: ShellArgs, ctx: ToolContext) -> ToolResult:
        limits = ctx.limits
        timeout = min(args.timeout_s or limits.shell_timeout_s, limits.shell_max_timeout_s)
        cwd = ctx.workspace
        if args.workdir:
            try:
                target = resolve_path(args.workdir, ctx.allowed_roots)
            except PathError as exc:
                return ToolResult.error(str(exc))
            if not target.real.is_dir():
                return ToolResult.error(f"workdir {args.workdir!r} is not a directory.")
            cwd = target.real
        if ctx.cancel_event.is_set():
            return ToolResult.error("Not run: the turn was interrupted.")
        try:
            outcome = run_process(
                [bash_path(), "-c", args.command],
                cwd=cwd,
                env=scrubbed_environment(ctx.base_env()),
                timeout_s=timeout,
                output_limit=limits.shell_output_chars,
                cancel_event=ctx.cancel_event,
                process_budget=limits.shell_process_budget,
                kill_grace_s=limits.shell_kill_grace_s,
            )
        except OSError as exc:
            return ToolResult.error(f"could not start the command: {exc.strerror or exc}")
        status = describe_outcome(outcome, timeout)
        body = outcome.output.rstrip("\n")
        output = f"{body}\n{status}" if body else status
        return ToolResult(
            ok=outcome.succeeded,
            output=output,
            truncated=outcome.truncated,
            data={
                "exit_code": outcome.exit_code,
                "signal": outcome.signal,
                "timed_out": outcome.timed_out,
                "cancelled": outcome.cancelled,
                "duration_s": round(outcome.duration_s, 3),
                "omitted_bytes": outcome.omitted_bytes,
            },
        )
