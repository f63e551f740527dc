"""The engine's own commands: serve, plan, bench, models (list, pull), cache.

They need nothing of the agent. `resident-engine` (and `python -m engine`)
runs them alone; the `resident` command mounts them beside the agent's, so
`resident serve` is the same command (agent/cli).
"""

from __future__ import annotations

import typer

from engine.cli.bench import bench_app
from engine.cli.cache import cache_app
from engine.cli.models import models_app
from engine.cli.plan import plan_command
from engine.cli.serve import serve

engine_app = typer.Typer(
    help="Resident's inference engine: serve models, plan capacity, benchmark.",
    no_args_is_help=True,
    add_completion=False,
)
engine_app.command("serve")(serve)
engine_app.command("plan")(plan_command)
engine_app.add_typer(models_app, name="models")
engine_app.add_typer(bench_app, name="bench")
engine_app.add_typer(cache_app, name="cache")
