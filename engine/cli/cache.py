"""`cache`: the prefix KV disk tier — what it holds, and freeing it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

cache_app = typer.Typer(
    help="The prefix KV kept on disk across sessions and server restarts.",
    no_args_is_help=True,
)

DIR_HELP = "The tier's folder (default: RESIDENT_CACHE_DIR/kv, else the user cache's resident/kv)."


def _root(directory: str | None) -> Path:
    from engine.kv.disk_tier import default_root

    return Path(directory) if directory else default_root()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@cache_app.command("list")
def cache_list(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    directory: str = typer.Option(None, "--dir", help=DIR_HELP),
) -> None:
    """Saved prefix KV, one line per engine state (model, KV dtype): pages, size, last use."""
    from engine.kv.disk_files import summary

    root = _root(directory)
    entries = summary(root)
    if as_json:
        typer.echo(json.dumps({"dir": str(root), "engines": entries}, indent=2))
        return
    if not entries:
        typer.echo(f"no saved prefix KV in {root}")
        return
    typer.echo(f"{root}:")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["last_used"]))
        typer.echo(
            f"  {e['model']:28} {e['kv_cache_dtype']:9} {e['pages']:6d} pages "
            f"{_size(e['bytes']):>10}  last used {when}  ({e['engine'][:12]})"
        )
    total = sum(e["bytes"] for e in entries)
    typer.echo(f"total {_size(total)}")


@cache_app.command("clear")
def cache_clear(directory: str = typer.Option(None, "--dir", help=DIR_HELP)) -> None:
    """Delete all saved prefix KV (sessions and servers prefill again, then save anew)."""
    from engine.kv.disk_files import clear

    root = _root(directory)
    typer.echo(f"freed {_size(clear(root))} in {root}")
