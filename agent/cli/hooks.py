"""`resident hooks list|trust|untrust`: the hooks a workspace has, and trust in the repository's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

hooks_app = typer.Typer(help="Hooks: your commands run at agent events (docs/HOOKS.md).")

WORKSPACE_HELP = "The repository (default: the current directory)."
TRUST_LABELS = {
    "own": "yours",
    "trusted": "trusted",
    "untrusted": "NOT trusted: run `resident hooks trust` to let them run",
    "changed": "CHANGED since you trusted it: run `resident hooks trust` again",
}


@hooks_app.callback()
def _hooks() -> None:
    """Hooks: your commands run at agent events (docs/HOOKS.md)."""


def _workspace(workspace: Path | None) -> Path:
    root = Path(os.path.realpath(workspace or Path.cwd()))
    if not root.is_dir():
        typer.secho(f"error: {root} is not a directory", fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    return root


def _hook_lines(hooks) -> list[str]:
    lines = []
    for hook in hooks:
        matcher = f" [{hook.matcher.pattern}]" if hook.matcher is not None else ""
        lines.append(f"  {hook.event}{matcher}: {hook.command}  (timeout {hook.timeout:g} s)")
    return lines


@hooks_app.command("list")
def hooks_list(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """List your hooks and the repository's, with whether the repository's may run.

    Exit code 1 when a hooks file has a problem."""
    from agent.core.hooks.config import load_hooks
    from agent.core.hooks.trust import HookTrust

    root = _workspace(workspace)
    config = load_hooks(root)
    trust = HookTrust()
    files = [
        (loaded, "own" if loaded.source == "user" else trust.state(root, loaded.digest))
        for loaded in (config.user, config.repository)
        if loaded is not None
    ]
    problems = [problem.describe() for problem in config.problems]
    if as_json:
        described = [
            {
                "path": str(loaded.path),
                "source": loaded.source,
                "trust": state,
                "sha256": loaded.digest,
                "hooks": [hook.describe() for hook in loaded.hooks],
            }
            for loaded, state in files
        ]
        typer.echo(json.dumps({"files": described, "problems": problems}, indent=2))
    else:
        if not files and not problems:
            typer.echo("No hooks: neither your hooks.json nor this repository's exists.")
        for loaded, state in files:
            typer.echo(f"{loaded.path} ({loaded.source}, {TRUST_LABELS[state]})")
            for line in _hook_lines(loaded.hooks) or ["  (no hooks)"]:
                typer.echo(line)
        for problem in problems:
            typer.secho(f"problem: {problem}", fg=typer.colors.RED, err=True)
    if problems:
        raise typer.Exit(1)


@hooks_app.command("trust")
def hooks_trust(
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """Let this repository's .resident/hooks.json run, as it is now (in the sandbox).

    Trust is recorded for this repository's path and this exact file content: any change
    to the file needs trust again. Read the file, and the scripts it runs, first."""
    from agent.core.hooks.config import REPOSITORY_FILE, HookProblem, read_hooks_file
    from agent.core.hooks.trust import HookTrust

    root = _workspace(workspace)
    loaded = read_hooks_file(root / REPOSITORY_FILE, "repository")
    if loaded is None:
        typer.secho(
            f"error: {root / REPOSITORY_FILE} does not exist", fg=typer.colors.RED, err=True
        )
        raise typer.Exit(1)
    if isinstance(loaded, HookProblem):
        typer.secho(
            f"error: {loaded.describe()}; fix it before trusting it", fg=typer.colors.RED, err=True
        )
        raise typer.Exit(1)
    HookTrust().trust(root, loaded.digest)
    typer.echo(f"Trusted {loaded.path} (sha256 {loaded.digest[:12]}); these hooks will run:")
    for line in _hook_lines(loaded.hooks) or ["  (none: the file declares no hooks)"]:
        typer.echo(line)


@hooks_app.command("untrust")
def hooks_untrust(
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """Take back trust in this repository's hooks; they stop running from the next session."""
    from agent.core.hooks.trust import HookTrust

    root = _workspace(workspace)
    if HookTrust().untrust(root):
        typer.echo(f"{root}: its hooks are no longer trusted.")
    else:
        typer.echo(f"{root}: its hooks were not trusted; nothing changed.")
