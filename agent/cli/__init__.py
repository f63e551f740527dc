"""The `resident` command.

`resident` with no subcommand opens the agent on the current repository: the
Textual TUI (agent/tui/) on a terminal, the line-by-line REPL
(agent/repl.py) with `--plain` or when stdin or stdout is not a terminal.
`resident acp` serves editors over the Agent Client Protocol (agent/acp/).
The engine's own commands (serve, plan, bench, models list/pull, cache) live in
engine/cli and are mounted here unchanged; `resident models calibrate` is the
agent's (models.py), `resident mcp` is in mcp.py and `resident hooks` in
hooks.py. The CLI is the one place outside agent/clients that imports the
engine.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import typer

from agent.cli.hooks import hooks_app
from agent.cli.mcp import mcp_app
from agent.cli.models import models_app
from agent.cli.options import agent_options
from agent.core.config import AgentConfig
from agent.core.process_guard import guard_agent_process
from engine.cli import bench_app, cache_app, plan_command, serve
from engine.cli.common import fail

app = typer.Typer(
    help="Resident: a terminal coding agent on its own inference engine.",
    no_args_is_help=False,
    add_completion=False,
)
# The engine's own commands (engine/cli), mounted beside the agent's.
app.command("serve")(serve)
app.command("plan")(plan_command)
app.add_typer(bench_app, name="bench")
app.add_typer(cache_app, name="cache")
app.add_typer(models_app, name="models")  # the engine's list and pull, and calibrate
app.add_typer(mcp_app, name="mcp")
app.add_typer(hooks_app, name="hooks")


def _check_config(config: AgentConfig) -> None:
    """The checks `resident`, `resident run` and `resident acp` share: a usage error exits 2."""
    problem = config.usage_error()
    if problem is not None:
        fail(problem, code=2)


def _on_terminal() -> bool:
    """Whether `resident` talks to a person at a terminal (the TUI) or to a pipe."""
    return sys.stdin.isatty() and sys.stdout.isatty()


# The three commands' options are AgentConfig's fields (agent/core/config.py), given
# to each by agent_options (agent/cli/options.py); each command builds one AgentConfig
# and RuntimeOptions.from_config turns it into what the runtime takes.


@app.callback(invoke_without_command=True)
@agent_options("main")
def main(ctx: typer.Context, **given: Any) -> None:
    """Open the agent on this repository: the TUI on a terminal, else line by line."""
    config = AgentConfig(**given)
    level = logging.INFO if config.verbose else logging.WARNING
    if ctx.invoked_subcommand is not None:
        logging.basicConfig(level=level)
        return
    from agent.core.runtime import RuntimeOptions
    from engine.errors import EngineError

    _check_config(config)
    guard_agent_process()
    options = RuntimeOptions.from_config(config)
    use_tui = not config.plain and _on_terminal()
    if use_tui:
        # Log lines would tear the screen: they go to a file in the data directory.
        from agent.core.session import data_dir

        log_file = data_dir() / "resident.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(level=level, filename=str(log_file))
    else:
        logging.basicConfig(level=level)
    try:
        if use_tui:
            from agent.tui import run_tui

            code = run_tui(options)
        else:
            from agent.repl import run_repl

            code = run_repl(options)
    except EngineError as err:
        fail(str(err))
    raise typer.Exit(code)


@app.command("run")
@agent_options("run")
def run(
    task: str = typer.Argument(..., help="The task; `-` reads it from stdin."), **given: Any
) -> None:
    """Run one task headless; exit 0 done, 1 failed, 2 usage, 3 approval, 75 transient, 130."""
    from agent.core.runtime import RuntimeOptions
    from agent.headless import HeadlessOptions, run_headless

    config = AgentConfig(**given)
    if task == "-":
        task = sys.stdin.read()
    if not task.strip():
        fail("the task is empty", code=2)
    _check_config(config)
    guard_agent_process()
    options = RuntimeOptions.from_config(config)
    raise typer.Exit(run_headless(HeadlessOptions(task=task, runtime=options, json=config.as_json)))


@app.command("acp")
@agent_options("acp")
def acp(**given: Any) -> None:
    """Speak the Agent Client Protocol on stdin/stdout, for editors (Zed, JetBrains).

    The editor starts this command; each session it opens is a session of the
    repository it names, resumable here and in the TUI. Logs go to stderr.
    """
    from agent.acp import run_acp
    from agent.core.runtime import RuntimeOptions, UnknownToolError, make_registry

    config = AgentConfig(**given)
    _check_config(config)
    try:
        make_registry(config.tool_names)
    except UnknownToolError as err:
        fail(str(err), code=2)
    guard_agent_process()
    raise typer.Exit(run_acp(RuntimeOptions.from_config(config)))


@app.command("sessions")
def sessions(
    all_workspaces: bool = typer.Option(False, "--all", help="Sessions of every repository."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Sessions of this repository, most recent first (resume with `run --resume ID`)."""
    import dataclasses
    import os
    from pathlib import Path

    from agent.core.session import SessionStore
    from agent.terminal_text import terminal_safe

    workspace = None if all_workspaces else Path(os.path.realpath(Path.cwd()))
    metas = SessionStore().list(workspace)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(m) for m in metas], indent=2))
        return
    for meta in metas:  # a title is the task's first words, or the model's
        typer.echo(terminal_safe(meta.describe(), one_line=True))
