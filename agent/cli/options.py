"""The options of `resident`, `resident run` and `resident acp`, derived from AgentConfig.

No option of the three commands is written here or in the commands: each is a
field of AgentConfig (agent/core/config.py: type, default, allowed values,
help). This module says only which settings each command exposes
(COMMAND_SETTINGS) and the flags that are not `--the-field-name` (FLAGS), one
table for all three, so a shared setting is spelled, defaulted and explained
the same way everywhere. `agent_options(command)` gives a command the
signature typer reads, as engine/cli/serve.py does for ServeOptions.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar, get_args, get_origin

import typer

from agent.core.config import (
    AgentConfig,
    default_setting,
    setting_bounds,
    setting_help,
)
from tools import ApprovalMode

F = TypeVar("F", bound=Callable[..., Any])

# Settings every way of starting the agent takes: where the model runs, how tools
# are approved and what shell commands may reach.
_SHARED = (
    *("model", "attach", "api_key", "context_window", "approval"),
    *("network", "sandbox_env", "sandbox_read"),
)
# The settings each command exposes; their --help order is AgentConfig's field order.
COMMAND_SETTINGS: dict[str, frozenset[str]] = {
    "main": frozenset({*_SHARED, "resume", "continue_last", "plain", "verbose"}),
    "run": frozenset(
        {*_SHARED, "as_json", "max_turns", "max_tokens", "resume", "continue_last"}
        | {"allow", "deny", "tools"}
    ),
    # An editor opens and resumes sessions itself: no --resume or --continue.
    "acp": frozenset({*_SHARED, "max_turns", "max_tokens", "allow", "deny", "tools"}),
}
# Flags other than `--field-name`; a bool is a plain flag (no `--no-name`).
FLAGS: dict[str, tuple[str, ...]] = {
    "as_json": ("--json",),
    "model": ("--model", "-m"),
    "continue_last": ("--continue",),
    "verbose": ("--verbose", "-v"),
}
ENVVARS: dict[str, str] = {"api_key": "RESIDENT_API_KEY"}


def command_settings(command: str) -> list[str]:
    """The settings `command` exposes, in AgentConfig's order."""
    exposed = COMMAND_SETTINGS[command]
    return [name for name in AgentConfig.model_fields if name in exposed]


def flags_of(name: str) -> tuple[str, ...]:
    """The flags of setting `name` (`--context-window`; `--json` for as_json)."""
    return FLAGS.get(name) or ("--" + name.replace("_", "-"),)


def _parse_approval(text: str) -> ApprovalMode:
    """`--approval`'s word as its mode; a bad one is a usage error (exit 2) naming the modes."""
    try:
        return ApprovalMode.parse(text)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _option_type(name: str) -> Any:
    """The type typer parses for setting `name`: the declared one without None, and a
    list for a repeatable setting (declared as a tuple, which typer reads as a fixed
    number of values)."""
    annotation = AgentConfig.model_fields[name].annotation
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) is tuple:
        return list[args[0]]
    if args and type(None) in get_args(annotation):
        return args[0]
    return annotation


def setting_option(name: str) -> Any:
    """The typer option of setting `name`, derived from its declaration."""
    annotation = AgentConfig.model_fields[name].annotation
    default = default_setting(name)
    extra: dict[str, Any] = {**setting_bounds(name)}
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        # Parsed at the edge (ApprovalMode.parse: case and `_` do not matter), so
        # the command gets the mode; typer lists the choices from the annotation.
        extra["parser"] = _parse_approval
    if name in ENVVARS:
        extra["envvar"] = ENVVARS[name]
    if isinstance(default, tuple):
        default = list(default)
    return typer.Option(default, *flags_of(name), help=setting_help(name), **extra)


def agent_options(command: str) -> Callable[[F], F]:
    """Give a command taking `**given` the options of the settings `command` exposes,
    after the command's own parameters (a context, the task argument)."""

    def decorate(func: F) -> F:
        hints = typing.get_type_hints(func)
        own = [
            param.replace(annotation=hints.get(param.name, param.annotation))
            for param in inspect.signature(func).parameters.values()
            if param.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        options = [
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=setting_option(name),
                annotation=_option_type(name),
            )
            for name in command_settings(command)
        ]
        func.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [*own, *options], return_annotation=None
        )
        return func

    return decorate
