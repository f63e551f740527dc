"""What the engine's commands share: the error exit, option help, and options for
engine settings built from their one declaration (EngineConfig, engine/config.py)."""

from __future__ import annotations

from typing import Any, Literal, NoReturn, get_origin

import typer

from engine.config import EngineConfig, setting_choices, setting_help

MODEL_HELP = EngineConfig.model_fields["model"].description or ""
_DECLARED: Any = object()  # "EngineConfig's default", told apart from a default of None


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: message` in red on stderr and exit with `code` (2: usage)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def setting_type(name: str) -> Any:
    """The type an option for setting `name` parses: a list of choices is parsed as a
    string and checked by the command (engine.config.unknown_choice), so the usage
    error names the flag and every allowed value in the engine's words."""
    annotation = EngineConfig.model_fields[name].annotation
    return str if get_origin(annotation) is Literal else annotation


def setting_option(name: str, *flags: str, default: Any = _DECLARED, note: str = "") -> Any:
    """A typer option for EngineConfig setting `name`, derived from its declaration:
    its default (unless the entry point declares its own), its help (plus `note`),
    its allowed values shown as the metavar, and its inclusive bounds as the range."""
    declared = EngineConfig.model_fields[name]
    choices = setting_choices(name)
    # Field(ge=..., le=...) constraints (annotated_types' Ge and Le); strict ones (gt)
    # are left to EngineConfig's validation.
    bounds = {
        bound: getattr(constraint, attr)
        for constraint in declared.metadata
        for attr, bound in (("ge", "min"), ("le", "max"))
        if hasattr(constraint, attr)
    }
    return typer.Option(
        declared.default if default is _DECLARED else default,
        *flags,
        help=" ".join(part for part in (setting_help(name), note) if part),
        metavar=f"[{'|'.join(map(str, choices))}]" if choices else None,
        **bounds,
    )
