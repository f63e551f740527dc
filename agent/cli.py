"""The `resident` command.

Until the agent lands, `resident` with no subcommand opens a plain streaming
chat with the model through the local engine (agent/chat_repl.py).
"""

from __future__ import annotations

import json
import logging
import sys

import typer

app = typer.Typer(
    help="Resident: a terminal coding agent on its own inference engine.",
    no_args_is_help=False,
    add_completion=False,
)
models_app = typer.Typer(help="List and fetch models.", no_args_is_help=True)
bench_app = typer.Typer(help="Measurements that print JSON.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")

MODEL_HELP = "Model name (see `resident models list`), Hugging Face model folder, or .gguf file."


def _fail(message: str, code: int = 1) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help=MODEL_HELP),
    kv_cache_dtype: str = typer.Option("fp8_e4m3", help="auto, bf16 or fp8_e4m3"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log engine details."),
) -> None:
    """Start an interactive chat with the model (the agent's TUI replaces this)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    if ctx.invoked_subcommand is not None:
        return
    from agent.chat_repl import run_chat
    from engine.errors import EngineError

    try:
        run_chat(model=model, kv_cache_dtype=kv_cache_dtype)
    except EngineError as err:
        _fail(str(err))


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Models Resident knows by name, and whether they are downloaded."""
    from engine.model_store import list_models

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
    from engine.model_store import pull_default_model

    try:
        path = pull_default_model(progress=sys.stderr.isatty())
    except EngineError as err:
        _fail(str(err))
    typer.echo(str(path))


@bench_app.command("throughput")
def bench_throughput(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help=MODEL_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    max_tokens: int = typer.Option(128, help="Tokens generated per prompt."),
    batch: int = typer.Option(16, help="Prompts in the batched run."),
    skip_transformers: bool = typer.Option(False, help="Measure the engine only."),
) -> None:
    """Decode tokens/s: engine (BF16 and FP8 KV) against transformers' generate."""
    from engine.benchmarks.throughput import format_table, run_throughput

    result = run_throughput(model, max_tokens, batch, with_transformers=not skip_transformers)
    typer.echo(json.dumps(result, indent=2) if as_json else format_table(result))


if __name__ == "__main__":
    app()
