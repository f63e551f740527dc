"""`resident mcp list|trust|untrust`: the MCP servers configured for a workspace (started once
to list their tools), and the user's trust in the repository's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from agent.terminal_text import terminal_safe

mcp_app = typer.Typer(help="MCP servers: what is configured, and the tools they offer.")


WORKSPACE_HELP = "The repository (default: the current directory)."


@mcp_app.callback()
def _mcp() -> None:
    """MCP servers: what is configured, and the tools they offer."""


def _root(workspace: Path | None) -> Path:
    root = Path(os.path.realpath(workspace or Path.cwd()))
    if not root.is_dir():
        typer.secho(f"error: {root} is not a directory", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    return root


@mcp_app.command("list")
def mcp_list(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    workspace: Path = typer.Option(
        None, "--workspace", "-w", help="The repository (default: the current directory)."
    ),
    tools: bool = typer.Option(True, "--tools/--no-tools", help="List each server's tools."),
) -> None:
    """List the configured MCP servers, their state and their tools.

    Each server is started as a session would start it (in the sandbox), listed and stopped.
    Exit code 1 when a config file has a problem.
    """
    from agent.core.mcp.config import load_config
    from agent.core.mcp.manager import McpManager
    from agent.core.mcp.report import status_json, status_lines
    from tools import default_tools
    from tools.sandbox.bubblewrap import Sandbox, detect_sandbox

    root = Path(os.path.realpath(workspace or Path.cwd()))
    if not root.is_dir():
        typer.secho(f"error: {root} is not a directory", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    config = load_config(root)
    sandbox = detect_sandbox(root)
    manager = McpManager(
        config,
        root,
        sandbox if isinstance(sandbox, Sandbox) else None,
        reserved=[tool.name for tool in default_tools()],
    )
    try:
        manager.start()
        longest = max((s.startup_timeout for s in config.servers.values()), default=0.0)
        manager.wait_settled(longest + 5)
        statuses = manager.statuses()
    finally:
        manager.stop()
    if as_json:
        typer.echo(json.dumps(status_json(statuses, config.problems), indent=2))
    else:
        # Names, targets, reasons and tool descriptions come from the config and the
        # servers themselves: each line shown as one line, control characters as text.
        for line in status_lines(statuses, config.problems, tools=tools):
            typer.echo(terminal_safe(line, one_line=True))
    if config.problems:
        raise typer.Exit(1)


def _repository_servers(root: Path, names: list[str]) -> dict[str, object]:
    """The repository's declared servers (raw entries) to act on: `names`, or all of them.
    Exits 1 with a clear message when there is no file, or a name is not declared."""
    from agent.core.mcp.config import REPOSITORY_FILE, read_config_file

    parsed, problem = read_config_file(root / REPOSITORY_FILE)
    if problem is not None:
        message = terminal_safe(f"error: {problem.describe()}; fix it first")
        typer.secho(message, fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    declared = dict(parsed.mcp_servers) if parsed is not None else {}
    if not declared:
        typer.secho(
            f"error: {root / REPOSITORY_FILE} declares no servers", fg=typer.colors.RED, err=True
        )
        raise typer.Exit(1)
    unknown = [n for n in names if n not in declared]
    if unknown:
        typer.secho(
            f"error: {root / REPOSITORY_FILE} declares no server named "
            f"{', '.join(json.dumps(n) for n in unknown)}; it declares "
            f"{', '.join(json.dumps(n) for n in declared)}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    return {n: declared[n] for n in (names or list(declared))}


@mcp_app.command("trust")
def mcp_trust(
    names: list[str] = typer.Argument(None, help="Servers to trust (default: all of them)."),
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """Let this repository's .resident/mcp.json servers start, as they are now.

    Trust is recorded for this repository's path, each server's entry as written and the
    files in the repository it names: any change to one of them needs trust again. A
    trusted server is treated as your own (its grants hold, ${VAR} expands)."""
    from agent.core.mcp.config import mcp_trust as trust_store
    from agent.core.mcp.trust import server_coverage

    root = _root(workspace)
    chosen = _repository_servers(root, names or [])
    broken = [n for n, raw in chosen.items() if not isinstance(raw, dict)]
    if broken:
        typer.secho(
            terminal_safe(
                f"error: {', '.join(broken)}: not an object with command or url; fix it first"
            ),
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    covered = {n: server_coverage(n, raw, root) for n, raw in chosen.items()}  # type: ignore[arg-type]
    trust_store().trust(root, covered)
    for name, coverage in covered.items():
        # json.dumps shows control characters escaped: a name or entry cannot redraw the line.
        typer.echo(f"Trusted {json.dumps(name)} (sha256 {coverage.digest[:12]}):")
        typer.echo(f"  {json.dumps(chosen[name], sort_keys=True)}")
        for covered_file in coverage.files:
            typer.echo(f"  covers {json.dumps(covered_file)}")


@mcp_app.command("untrust")
def mcp_untrust(
    names: list[str] = typer.Argument(None, help="Servers to untrust (default: all of them)."),
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """Take back trust in this repository's servers; they stop starting from the next session."""
    from agent.core.mcp.config import mcp_trust as trust_store

    root = _root(workspace)
    taken = trust_store().untrust(root, names or None)
    if taken:
        typer.echo(f"{root}: no longer trusted: {', '.join(json.dumps(n) for n in taken)}.")
    else:
        typer.echo(f"{root}: nothing of that was trusted; nothing changed.")
