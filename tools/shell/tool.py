"""The `shell` tool: run a bash command in the workspace, bounded in time, output and processes.

Every command runs in the OS sandbox when there is one (tools.sandbox.bubblewrap),
with what the permission policy granted the call: a read-only workspace
unless it was approved or allowed to write, no network unless allowed. Its
environment comes from an allow-list either way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.git.env import forced_config_env
from tools.process.environment import command_environment
from tools.process.limits import Limits
from tools.process.run import ProcessOutcome, run_process
from tools.sandbox.grants import READ_ONLY, SandboxError, SandboxGrant
from tools.sandbox.mounts import PROJECT_CONFIG
from tools.workspace.paths import PathError, resolve_path

# Errors that mean "the sandbox kept this read-only", worth a hint for the model.
_READ_ONLY_ERRORS = ("Read-only file system", "EROFS")


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
        return self.run_granted(args, ctx, READ_ONLY)

    def run_granted(self, args: ShellArgs, ctx: ToolContext, grant: SandboxGrant) -> ToolResult:
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
            argv, env = command_line(args.command, ctx, cwd, grant)
        except SandboxError as exc:
            return ToolResult.error(f"Not run: {exc}.")
        absent_config = [p for p in PROJECT_CONFIG if not os.path.lexists(ctx.workspace / p)]
        try:
            outcome = run_process(
                argv,
                cwd=cwd,
                env=env,
                timeout_s=timeout,
                output_limit=limits.shell_output_chars,
                cancel_event=ctx.cancel_event,
                process_budget=limits.shell_process_budget,
                kill_grace_s=limits.shell_kill_grace_s,
                limits=Limits(
                    cpu_seconds=limits.shell_cpu_seconds, file_bytes=limits.shell_max_file_bytes
                ),
            )
        except OSError as exc:
            return ToolResult.error(f"could not start the command: {exc.strerror or exc}")
        status = describe_outcome(outcome, timeout)
        body = outcome.output.rstrip("\n")
        output = f"{body}\n{status}" if body else status
        created = remove_created_config(ctx.workspace, absent_config)
        if created:
            output += (
                f"\n[removed {', '.join(created)}: commands may not create Resident's project "
                "configuration; the user writes it]"
            )
        if ctx.sandbox is not None and not grant.write and not outcome.succeeded:
            if not body.startswith("bwrap:") and any(m in body for m in _READ_ONLY_ERRORS):
                output += (
                    "\n[the workspace was read-only for this command because it ran without "
                    "approval; a command that changes files must be approved]"
                )
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
                "sandbox": sandbox_label(ctx, grant),
            },
        )


def remove_created_config(workspace: Path, absent: list[str]) -> list[str]:
    """Project configuration a command created (the sandbox can keep existing files
    read-only, not stop new ones from appearing): removed before anything reads it."""
    created = []
    for name in absent:
        path = workspace / name
        if not os.path.lexists(path):
            continue
        created.append(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return created


def sandbox_label(ctx: ToolContext, grant: SandboxGrant) -> str:
    if ctx.sandbox is None:
        return "none"
    access = "read-write" if grant.write else "read-only"
    return f"{access}, network {'on' if grant.network else 'off'}"


def command_line(
    command: str, ctx: ToolContext, cwd, grant: SandboxGrant
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run `command`: inside the sandbox when there is
    one (its HOME an empty folder at the user's home path, TMPDIR private)."""
    base = ctx.base_env()
    names = ctx.sandbox_settings.env_names
    argv = [bash_path(), "-c", command]
    if ctx.sandbox is None:
        return argv, command_environment(base, home=base.get("HOME"), extra_names=names)
    home = base.get("HOME") or os.path.expanduser("~")
    env = command_environment(
        base, home=home, tmpdir="/tmp", extra_names=names, extra=forced_config_env()
    )
    wrapped = ctx.sandbox.wrap(
        argv,
        workspace=ctx.workspace,
        cwd=cwd,
        grant=grant,
        extra_roots=ctx.extra_roots,
        env=base,
        settings=ctx.sandbox_settings,
    )
    return wrapped, env
