"""`serve`: the model over the OpenAI-, Anthropic- and Responses-compatible HTTP API.

The command's options are not written here: each is a field of ServeOptions
(engine/server/options.py), the server's own options declared there and the
engine settings derived from EngineConfig (engine/config.py), so a flag's
default, help and allowed values are the ones the engine declares. The
signature typer reads is built from those fields below.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import typing
from typing import Any

import typer

from engine.cli.common import fail, setting_option, setting_type
from engine.host import early_pages, start_up_collector
from engine.server.options import SERVE_FLAGS, SERVE_SETTINGS, ServeOptions


def serve(**given: Any) -> None:
    """Serve the model over HTTP: OpenAI chat and completions, Responses, Anthropic Messages."""
    if not logging.getLogger().handlers:  # `resident-engine serve`; `resident` sets its own
        logging.basicConfig(level=logging.WARNING)
    # What the server says while it starts: what it holds, where it listens, and a first
    # start's FP8 KV calibration (seconds to tens of seconds on a CPU, silent otherwise).
    for name in ("resident.serve", "engine.kv.calibration"):
        logging.getLogger(name).setLevel(logging.INFO)
    options = ServeOptions(**given)
    # Before the imports below (torch's takes a second): no garbage collection until the
    # server is about to serve (start_up_collector.py), and the packed weights' memory,
    # made on the other core meanwhile. The server runs on CUDA when it can (no --device).
    start_up_collector.hold()
    try:
        _serve(options)
    finally:
        # A serve that never got as far as serving (a usage error, a failed load) gives
        # the collector back unfrozen; one that served released it already.
        start_up_collector.release(freeze=False)


def _serve(options: ServeOptions) -> None:
    if early_pages.packs_here(options.model, None, options.tensor_parallel_size * options.nnodes):
        early_pages.prepare(options.model)
    from engine.errors import EngineError
    from engine.server.launch import ServeUsageError, check_options
    from engine.server.launch import serve as run_server

    try:
        check_options(options)
    except ServeUsageError as err:
        fail(str(err), code=2)
    try:
        code = run_server(options)
    except ServeUsageError as err:  # e.g. the port is taken
        fail(str(err), code=2)
    except (EngineError, ValueError) as err:
        fail(str(err))
    if code:
        raise typer.Exit(code)


def _parameter(option: dataclasses.Field, hints: dict[str, Any]) -> inspect.Parameter:
    """The typer parameter of one ServeOptions field."""
    name = option.name
    if name in SERVE_SETTINGS:
        default = setting_option(name, *SERVE_FLAGS.get(name, ()), default=option.default)
        annotation = setting_type(name)
    else:
        meta = option.metadata
        default = typer.Option(option.default, help=meta["help"], envvar=meta.get("envvar"))
        annotation = hints[name]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def _signature() -> inspect.Signature:
    """Every ServeOptions field with help, the model first (it says what is served)."""
    hints = typing.get_type_hints(ServeOptions)
    fields = [f for f in dataclasses.fields(ServeOptions) if "help" in f.metadata]
    fields.sort(key=lambda f: f.name != "model")
    return inspect.Signature([_parameter(f, hints) for f in fields], return_annotation=None)


serve.__signature__ = _signature()  # type: ignore[attr-defined]
