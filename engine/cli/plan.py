"""`plan`: KV bytes per token and capacity for a model on a GPU set, without weights."""

from __future__ import annotations

import json

import typer

from engine.cli.common import fail


def plan_command(
    model: list[str] = typer.Option(
        None, "--model", "-m", help="Preset, config.json path or model folder (repeatable)."
    ),
    all_presets: bool = typer.Option(False, "--all-presets", help="Plan every preset."),
    gpu: str = typer.Option("h200", help="h100, h200 or b200."),
    num_gpus: int = typer.Option(8, "--num-gpus", help="GPUs in the set."),
    tp: int = typer.Option(None, "--tp", help="Tensor-parallel size (default: --num-gpus)."),
    gpu_memory: float = typer.Option(None, "--gpu-memory", help="GiB per GPU instead of --gpu."),
    memory_fraction: float = typer.Option(None, help="Share of GPU memory for weights+KV [0.9]."),
    activation_reserve: float = typer.Option(None, help="GiB per GPU for activations [10]."),
    context: int = typer.Option(None, min=1, help="Tokens per request [the model's limit]."),
    weights: str = typer.Option(None, help="bf16, fp8 or int4 [the checkpoint's form]."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """KV bytes per token and BF16/FP8 KV capacity for a model on a GPU set, without weights."""
    from engine.errors import EngineError
    from engine.planner.capacity import (
        PlanInputs,
        assumption_lines,
        plan,
        preset_names,
        render_plans,
    )

    specs = list(model or []) + (preset_names() if all_presets else [])
    if not specs:
        fail(f"pass --model (a preset: {', '.join(preset_names())}) or --all-presets", code=2)
    if weights is not None and weights not in ("bf16", "fp8", "int4"):
        fail("--weights must be bf16, fp8 or int4", code=2)
    overrides = {
        "memory_fraction": memory_fraction,
        "activation_reserve_gib": activation_reserve,
    }
    inputs = PlanInputs(
        gpu=gpu,
        num_gpus=num_gpus,
        tp=tp,
        gpu_memory_gib=gpu_memory,
        context=context,
        weights=weights,
        **{key: value for key, value in overrides.items() if value is not None},
    )
    try:
        plans = [plan(spec, inputs) for spec in specs]
    except EngineError as err:
        fail(str(err), code=2)
    if as_json:
        typer.echo(json.dumps(plans[0] if len(plans) == 1 else plans, indent=2))
        return
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(render_plans(plans))
    for line in assumption_lines(plans):
        console.print(line, highlight=False, soft_wrap=True)
