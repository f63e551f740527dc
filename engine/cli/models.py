"""`models`: the models Resident knows by name, and fetching the default one."""

from __future__ import annotations

import json
import sys

import typer

from engine.cli.common import fail

models_app = typer.Typer(help="List and fetch models.", no_args_is_help=True)


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Models Resident knows by name, and whether they are downloaded."""
    from engine.model_files.store import list_models

    entries = list_models()
    if as_json:
        typer.echo(json.dumps(entries, indent=2, default=str))
        return
    for entry in entries:
        state = "present" if entry.get("present") else "not pulled (resident models pull)"
        typer.echo(f"{entry['name']:28} {state:36} {entry.get('path', '')}")


@models_app.command("pull")
def models_pull() -> None:
    """Fetch and convert the default model (SmolLM2-135M-Instruct); does nothing if present."""
    from engine.errors import EngineError
    from engine.model_files.store import pull_default_model

    try:
        path = pull_default_model(progress=sys.stderr.isatty())
    except EngineError as err:
        fail(str(err))
    typer.echo(str(path))
