"""What the engine's commands share: the error exit and option help."""

from __future__ import annotations

from typing import NoReturn

import typer

MODEL_HELP = "Model name (see `resident models list`), Hugging Face model folder, or .gguf file."


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: message` in red on stderr and exit with `code` (2: usage)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)
