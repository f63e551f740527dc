"""`resident models`: the engine's list and pull, and calibrating FP8 KV scales on a repository.

Calibration is the agent's: it measures on the files the resident snapshot
would take (agent/core/context/selection.py), so it lives here, beside the
engine's own model commands (engine/cli/models.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from engine.cli.common import MODEL_HELP, fail, setting_option
from engine.cli.models import models_app as engine_models_app
from engine.config import unknown_choice
from engine.kv.dtypes import FP8_KV_DTYPE
from engine.model_files.store import DEFAULT_MODEL_NAME

models_app = typer.Typer(
    help="List, fetch, and calibrate FP8 KV scales for models.", no_args_is_help=True
)
models_app.registered_commands.extend(engine_models_app.registered_commands)


def _calibration_texts(paths: list[Path]) -> list[str]:
    """The texts of the files under `paths` as the resident snapshot would take them
    (ignored, binary, generated and oversized files left out)."""
    from agent.core.context.selection import DEFAULT_MAX_FILE_BYTES, read_candidate, select_files

    texts: list[str] = []
    for path in paths:
        if path.is_dir():
            files, _ = select_files(path)
            texts += [file.text for file in files]
        elif path.is_file():
            entry, why = read_candidate(path.parent, path.name, DEFAULT_MAX_FILE_BYTES)
            if entry is None:
                fail(f"{path}: not usable text ({why.reason if why else 'unreadable'})", code=2)
            texts.append(entry.text)
        else:
            fail(f"{path}: no such file or folder", code=2)
    return texts


@models_app.command("calibrate")
def models_calibrate(
    paths: list[Path] = typer.Argument(
        None, help="Files or folders of text like what will be served [the current folder]."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="The scales file to write (`resident serve --kv-scales`)."
    ),
    model: str = typer.Option(DEFAULT_MODEL_NAME, "--model", "-m", help=MODEL_HELP),
    dtype: str = setting_option("dtype"),
    kv_rotation: str = setting_option("kv_rotation", note="Serve with the same rotation."),
    kv_scales_per_head: bool = setting_option("kv_scales_per_head", "--kv-scales-per-head"),
    window: int = typer.Option(2048, min=16, help="Tokens per window (capped at the context)."),
    max_windows: int = typer.Option(32, min=1, help="Windows prefilled, evenly spread."),
    margin: float = typer.Option(
        None, min=1.0, help="Headroom over the measured |max| [the engine's default, 1.25]."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the scales document."),
) -> None:
    """Measure FP8 KV scales on your own text and write them for `resident serve --kv-scales`."""
    from engine import LLM
    from engine.errors import EngineError
    from engine.kv.calibration import calibrate_on_texts
    from engine.kv.scales import write_scales_file

    for name, value in (("kv_rotation", kv_rotation), ("dtype", dtype)):
        message = unknown_choice(name, value, "--" + name.replace("_", "-"))
        if message:
            fail(message, code=2)
    if not out.parent.is_dir():
        fail(f"--out: the folder {out.parent} does not exist", code=2)
    texts = _calibration_texts(paths or [Path.cwd()])
    files = len(texts)
    if not texts:
        fail("no text files to calibrate on under the given paths", code=2)
    try:
        llm = LLM(
            model,
            dtype=dtype,
            kv_cache_dtype=FP8_KV_DTYPE,  # the scales measured are the FP8 cache's
            kv_rotation=kv_rotation,
            kv_scales_per_head=kv_scales_per_head,
            enable_prefix_caching=False,
        )
        document = calibrate_on_texts(
            llm, texts, window=window, max_windows=max_windows, margin=margin
        )
    except EngineError as err:
        fail(str(err))
    document["files"] = files
    write_scales_file(out, document)
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    typer.echo(
        f"wrote {out}: {document['granularity'].replace('_', ' ')} scales, rotation "
        f"{document['kv_rotation']}, from {document['windows']} windows of up to "
        f"{document['window_tokens']:,} tokens ({document['calibration_tokens']:,} of "
        f"{document['corpus_tokens']:,} tokens in {files} files)\n"
        f"serve with: resident serve --model {model} --kv-scales {out}"
    )
