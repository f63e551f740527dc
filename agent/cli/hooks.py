"""`resident hooks list|trust|untrust`: the hooks a workspace has, and trust in the repository's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from agent.terminal_text import terminal_safe

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
    """One line per hook. The command is shown as it will run, every control character
    as text (`\\r`, `\\x1b[2K`, a newline as `\\n`): what a person trusts must be what
    runs, not what a terminal redraws it as."""
    lines = []
    for hook in hooks:
        pattern = hook.matcher.pattern if hook.matcher is not None else None
        matcher = f" [{terminal_safe(pattern, one_line=True)}]" if pattern is not None else ""
        command = terminal_safe(hook.command, one_line=True)
        lines.append(f"  {hook.event}{matcher}: {command}  (timeout {hook.timeout:g} s)")
    return lines


@hooks_app.command("list")
def hooks_list(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """List your hooks and the repository's, with whether the repository's may run.

    Exit code 1 when a hooks file has a problem."""
    from agent.core.hooks.config import load_hooks
    from agent.core.hooks.scripts import hooks_coverage
    from agent.core.hooks.trust import HookTrust

    root = _workspace(workspace)
    config = load_hooks(root)
    trust = HookTrust()
    files = [
        (
            loaded,
            "own"
            if loaded.source == "user"
            else trust.state(root, hooks_coverage(loaded, root).digest),
        )
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
            shown = terminal_safe(str(loaded.path), one_line=True)
            typer.echo(f"{shown} ({loaded.source}, {TRUST_LABELS[state]})")
            for line in _hook_lines(loaded.hooks) or ["  (no hooks)"]:
                typer.echo(line)
        for problem in problems:
            typer.secho(terminal_safe(f"problem: {problem}"), fg=typer.colors.RED, err=True)
    if problems:
        raise typer.Exit(1)


@hooks_app.command("trust")
def hooks_trust(
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """Let this repository's .resident/hooks.json run, as it is now (in the sandbox).

    Trust is recorded for this repository's path, this exact file content and the
    content of every file in the repository its commands name: any change to one of them
    needs trust again. Read the file, and the scripts it runs, first."""
    from agent.core.hooks.config import REPOSITORY_FILE, HookProblem, read_hooks_file
    from agent.core.hooks.scripts import hooks_coverage
    from agent.core.hooks.trust import HookTrust

    root = _workspace(workspace)
    loaded = read_hooks_file(root / REPOSITORY_FILE, "repository")
    if loaded is None:
        typer.secho(
            terminal_safe(f"error: {root / REPOSITORY_FILE} does not exist"),
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    if isinstance(loaded, HookProblem):
        typer.secho(
            terminal_safe(f"error: {loaded.describe()}; fix it before trusting it"),
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    coverage = hooks_coverage(loaded, root)
    HookTrust().trust(root, coverage.digest, coverage.files)
    shown = terminal_safe(str(loaded.path), one_line=True)
    typer.echo(f"Trusted {shown} (sha256 {coverage.digest[:12]}); these hooks will run:")
    for line in _hook_lines(loaded.hooks) or ["  (none: the file declares no hooks)"]:
        typer.echo(line)
    if coverage.files:
        typer.echo("Covered with it (a change to any of them needs trust again):")
        for name in coverage.files:
            typer.echo(f"  {json.dumps(name)}")


@hooks_app.command("untrust")
def hooks_untrust(
    workspace: Path = typer.Option(None, "--workspace", "-w", help=WORKSPACE_HELP),
) -> None:
    """Take back trust in this repository's hooks; they stop running from the next session."""
    from agent.core.hooks.trust import HookTrust

    root = _workspace(workspace)
    if HookTrust().untrust(root):
        typer.echo(terminal_safe(f"{root}: its hooks are no longer trusted."))
    else:
        typer.echo(terminal_safe(f"{root}: its hooks were not trusted; nothing changed."))
