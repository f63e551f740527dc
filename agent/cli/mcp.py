"""`resident mcp list`: the MCP servers configured for a workspace, started once to list their tools."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

mcp_app = typer.Typer(help="MCP servers: what is configured, and the tools they offer.")


@mcp_app.callback()
def _mcp() -> None:
    """MCP servers: what is configured, and the tools they offer."""


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
        for line in status_lines(statuses, config.problems, tools=tools):
            typer.echo(line)
    if config.problems:
        raise typer.Exit(1)
