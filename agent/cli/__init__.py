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
from pathlib import Path
from typing import Any

import typer

from agent.cli.hooks import hooks_app
from agent.cli.mcp import mcp_app
from agent.cli.models import models_app
from agent.core.process_guard import guard_agent_process
from engine.cli import bench_app, cache_app, plan_command, serve
from engine.cli.common import MODEL_HELP, fail
from tools import ApprovalMode

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

# The modes themselves are listed by typer from the ApprovalMode annotation.
APPROVAL_HELP = "How tool calls are approved (ask asks; nobody answers in headless runs)."
NETWORK_HELP = (
    "Let shell commands use the network and web_fetch reach public hosts without asking "
    "(off by default; an allow rule 'network:PREFIX' allows it for matching commands only, "
    "'web_fetch:HOST' for one host)."
)
SANDBOX_ENV_HELP = "An environment variable shell commands may see (repeatable)."
SANDBOX_READ_HELP = "A folder shell commands may read, read-only (repeatable)."


def _parse_approval(text: str) -> ApprovalMode:
    """`--approval`'s word as its mode; a bad one is a usage error (exit 2) naming the modes."""
    try:
        return ApprovalMode.parse(text)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def approval_option(help: str = APPROVAL_HELP) -> Any:
    """The `--approval` option of `resident`, `run` and `acp`: parsed here, at the edge,
    so the commands get an ApprovalMode; its choices are the enum's."""
    return typer.Option(ApprovalMode.ASK, parser=_parse_approval, help=help)


def _check_agent_options(
    model: str | None, attach: str | None, resume: str | None, continue_last: bool
) -> None:
    """The checks `resident`, `resident run` and `resident acp` share."""
    if model and attach is None and model.startswith(("http://", "https://")):
        fail("--model takes a model name or path; use --attach URL for a server", code=2)
    if resume and continue_last:
        fail("use --resume ID or --continue, not both", code=2)


def _on_terminal() -> bool:
    """Whether `resident` talks to a person at a terminal (the TUI) or to a pipe."""
    return sys.stdin.isatty() and sys.stdout.isatty()


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    attach: str = typer.Option(None, help="URL of an OpenAI-compatible server to use instead."),
    api_key: str = typer.Option(None, envvar="RESIDENT_API_KEY", help="API key for --attach."),
    context_window: int = typer.Option(
        None, min=256, help="Tokens per request, for servers without /v1/engine/stats."
    ),
    approval: ApprovalMode = approval_option(),
    resume: str = typer.Option(None, help="Continue the session with this id."),
    continue_last: bool = typer.Option(
        False, "--continue", help="Continue this repository's latest session."
    ),
    plain: bool = typer.Option(
        False, "--plain", help="Line-by-line prompt instead of the TUI (also when piped)."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log engine details."),
    network: bool = typer.Option(False, "--network", help=NETWORK_HELP),
    sandbox_env: list[str] = typer.Option([], "--sandbox-env", help=SANDBOX_ENV_HELP),
    sandbox_read: list[Path] = typer.Option([], "--sandbox-read", help=SANDBOX_READ_HELP),
) -> None:
    """Open the agent on this repository: the TUI on a terminal, else line by line."""
    if ctx.invoked_subcommand is not None:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
        return
    from agent.core.runtime import RuntimeOptions
    from engine.errors import EngineError

    _check_agent_options(model, attach, resume, continue_last)
    guard_agent_process()
    options = RuntimeOptions(
        model=model,
        attach=attach,
        api_key=api_key,
        context_window=context_window,
        approval=approval,
        resume=resume,
        continue_last=continue_last,
        network=network,
        sandbox_env=tuple(sandbox_env),
        sandbox_read=tuple(sandbox_read),
    )
    use_tui = not plain and _on_terminal()
    if use_tui:
        # Log lines would tear the screen: they go to a file in the data directory.
        from agent.core.session import data_dir

        log_file = data_dir() / "resident.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        level = logging.INFO if verbose else logging.WARNING
        logging.basicConfig(level=level, filename=str(log_file))
    else:
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
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
def run(
    task: str = typer.Argument(..., help="The task; `-` reads it from stdin."),
    as_json: bool = typer.Option(False, "--json", help="Print every event as a JSON line."),
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    attach: str = typer.Option(None, help="URL of an OpenAI-compatible server to use instead."),
    api_key: str = typer.Option(None, envvar="RESIDENT_API_KEY", help="API key for --attach."),
    context_window: int = typer.Option(
        None, min=256, help="Tokens per request, for servers without /v1/engine/stats."
    ),
    approval: ApprovalMode = approval_option(),
    max_turns: int = typer.Option(50, min=1, help="Model requests allowed for the task."),
    max_tokens: int = typer.Option(None, min=1, help="Tokens allowed per answer."),
    resume: str = typer.Option(None, help="Continue the session with this id."),
    continue_last: bool = typer.Option(
        False, "--continue", help="Continue this repository's latest session."
    ),
    allow: list[str] = typer.Option([], help="Allow rule, e.g. 'shell:pytest' (repeatable)."),
    deny: list[str] = typer.Option([], help="Deny rule, e.g. 'shell:git push' (repeatable)."),
    tools: str = typer.Option(None, help="Offer only these tools, e.g. 'read,grep,list'."),
    network: bool = typer.Option(False, "--network", help=NETWORK_HELP),
    sandbox_env: list[str] = typer.Option([], "--sandbox-env", help=SANDBOX_ENV_HELP),
    sandbox_read: list[Path] = typer.Option([], "--sandbox-read", help=SANDBOX_READ_HELP),
) -> None:
    """Run one task headless; exit 0 done, 1 failed, 2 usage, 3 approval, 75 transient, 130."""
    from agent.core.loop import AgentSettings
    from agent.core.runtime import RuntimeOptions
    from agent.headless import HeadlessOptions, run_headless

    if task == "-":
        task = sys.stdin.read()
    if not task.strip():
        fail("the task is empty", code=2)
    _check_agent_options(model, attach, resume, continue_last)
    guard_agent_process()
    options = RuntimeOptions(
        model=model,
        attach=attach,
        api_key=api_key,
        context_window=context_window,
        approval=approval,
        network=network,
        sandbox_env=tuple(sandbox_env),
        sandbox_read=tuple(sandbox_read),
        allow=tuple(allow),
        deny=tuple(deny),
        resume=resume,
        continue_last=continue_last,
        tools=tuple(name.strip() for name in tools.split(",") if name.strip()) if tools else None,
        settings=AgentSettings(max_turns=max_turns, max_tokens=max_tokens),
    )
    raise typer.Exit(run_headless(HeadlessOptions(task=task, runtime=options, json=as_json)))


@app.command("acp")
def acp(
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    attach: str = typer.Option(None, help="URL of an OpenAI-compatible server to use instead."),
    api_key: str = typer.Option(None, envvar="RESIDENT_API_KEY", help="API key for --attach."),
    context_window: int = typer.Option(
        None, min=256, help="Tokens per request, for servers without /v1/engine/stats."
    ),
    approval: ApprovalMode = approval_option(
        "The approval mode sessions start in (the editor can switch it)."
    ),
    max_turns: int = typer.Option(50, min=1, help="Model requests allowed per prompt."),
    max_tokens: int = typer.Option(None, min=1, help="Tokens allowed per answer."),
    allow: list[str] = typer.Option([], help="Allow rule, e.g. 'shell:pytest' (repeatable)."),
    deny: list[str] = typer.Option([], help="Deny rule, e.g. 'shell:git push' (repeatable)."),
    tools: str = typer.Option(None, help="Offer only these tools, e.g. 'read,grep,list'."),
    network: bool = typer.Option(False, "--network", help=NETWORK_HELP),
    sandbox_env: list[str] = typer.Option([], "--sandbox-env", help=SANDBOX_ENV_HELP),
    sandbox_read: list[Path] = typer.Option([], "--sandbox-read", help=SANDBOX_READ_HELP),
) -> None:
    """Speak the Agent Client Protocol on stdin/stdout, for editors (Zed, JetBrains).

    The editor starts this command; each session it opens is a session of the
    repository it names, resumable here and in the TUI. Logs go to stderr.
    """
    from agent.acp import run_acp
    from agent.core.loop import AgentSettings
    from agent.core.runtime import RuntimeOptions, UnknownToolError, make_registry

    _check_agent_options(model, attach, None, False)
    selected = tuple(n.strip() for n in tools.split(",") if n.strip()) if tools else None
    try:
        make_registry(selected)
    except UnknownToolError as err:
        fail(str(err), code=2)
    guard_agent_process()
    options = RuntimeOptions(
        model=model,
        attach=attach,
        api_key=api_key,
        context_window=context_window,
        approval=approval,
        allow=tuple(allow),
        deny=tuple(deny),
        tools=selected,
        network=network,
        sandbox_env=tuple(sandbox_env),
        sandbox_read=tuple(sandbox_read),
        settings=AgentSettings(max_turns=max_turns, max_tokens=max_tokens),
    )
    raise typer.Exit(run_acp(options))


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
