"""Which KV scales and rotation are in force, and the scales file that `--kv-scales` reads.

Sources, in order (DESIGN.md §3): a scales file (`kv_scales_file`), the
checkpoint's `k_scale`/`v_scale` tensors, else calibration from the first
prefill of each layer (amax / 448 with a margin), frozen afterwards.
`LLM.calibrate_kv_scales(prompts, path)` calibrates over a prompt set instead
and writes a file in the format below.

Scales are only valid for the values they were measured on, so they carry
the rotation: a file says which `kv_rotation` it was measured with, and
checkpoint scales are always for unrotated K and V. `kv_rotation="auto"`
(the default) is `hadamard` for an fp8_e4m3 cache unless fixed scales were
measured without rotation, where it is `none`; `none` for other cache dtypes.
An explicit `hadamard` with checkpoint scales ignores them and calibrates.

File format (JSON):

    {"format": "resident-kv-scales", "version": 1, "kv_rotation": "hadamard",
     "layout": "gqa", "granularity": "per_layer" | "per_head",
     "k": [per layer: a float, or a list of one float per KV head], "v": [...]}

MLA models give "latent" and "rope" lists instead of "k" and "v" (a file
with only "k" and "v" is read as latent and rope). Other fields (model,
source, margin) are informational.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.collectives import parallel
from engine.errors import EngineError

log = logging.getLogger(__name__)

SCALES_FORMAT = "resident-kv-scales"
SCALES_VERSION = 1
SCALE_KEYS = {"gqa": ("k", "v"), "mla": ("latent", "rope")}


@dataclass
class ScalesFile:
    path: str
    first: torch.Tensor  # K (GQA) or latent (MLA) scales
    second: torch.Tensor  # V or rope scales
    rotation: str | None  # what the scales were measured with; None when the file does not say


def read_scales_file(path: str | Path, layout_kind: str) -> ScalesFile:
    """Read and shape-check nothing yet (the pool validates); raise EngineError when unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EngineError(f"cannot read the KV scales file {path}: {err}") from None
    if not isinstance(data, dict):
        raise EngineError(f"{path}: a KV scales file is a JSON object")
    first_key, second_key = SCALE_KEYS.get(layout_kind, ("k", "v"))
    if first_key not in data and "k" in data:
        first_key, second_key = "k", "v"
    if first_key not in data or second_key not in data:
        raise EngineError(f"{path}: a KV scales file needs {first_key!r} and {second_key!r} lists")
    rotation = data.get("kv_rotation")
    if rotation is not None and rotation not in ("none", "hadamard"):
        raise EngineError(f"{path}: kv_rotation {rotation!r} is neither none nor hadamard")
    try:
        first = torch.tensor(data[first_key], dtype=torch.float32)
        second = torch.tensor(data[second_key], dtype=torch.float32)
    except (TypeError, ValueError) as err:
        raise EngineError(f"{path}: scales must be numbers or per-head lists: {err}") from None
    return ScalesFile(str(path), first, second, rotation)


def resolve_rotation(
    requested: str, kv_dtype: str, scales_file: ScalesFile | None, has_checkpoint_scales: bool
) -> str:
    """The rotation to use: `none` or `hadamard` (see the module docstring for `auto`)."""
    if requested not in ("auto", "none", "hadamard"):
        raise EngineError(f"kv_rotation must be auto, none or hadamard, not {requested!r}")
    if scales_file is not None and scales_file.rotation is not None:
        if requested != "auto" and requested != scales_file.rotation:
            raise EngineError(
                f"the KV scales in {scales_file.path} were measured with kv_rotation "
                f"{scales_file.rotation}, not {requested}; use that rotation or recalibrate"
            )
    if requested != "auto":
        return requested
    if kv_dtype != "fp8_e4m3":
        return "none"
    if scales_file is not None:
        return scales_file.rotation or "none"
    return "none" if has_checkpoint_scales else "hadamard"


def apply_fixed_scales(
    pool,
    rotation: str,
    scales_file: ScalesFile | None,
    checkpoint_scales: tuple[torch.Tensor, torch.Tensor] | None,
    per_head: bool,
) -> None:
    """Give the pool the file's or the checkpoint's scales where they fit; else it calibrates.

    Per-head scales are for every KV head of the model; a tensor-parallel rank
    takes the columns of its own heads."""
    if not pool.is_fp8:
        return
    if scales_file is not None:
        if scales_file.rotation is None and rotation != "none":
            log.warning(
                "%s does not say which kv_rotation its scales were measured with; "
                "using them with %s",
                scales_file.path,
                rotation,
            )
        try:
            first, second = (_rank_heads(t) for t in (scales_file.first, scales_file.second))
            pool.set_scales(first, second, source="file")
        except ValueError as err:
            raise EngineError(f"{scales_file.path}: {err}") from None
        return
    if checkpoint_scales is None:
        return
    if rotation != "none":
        log.warning(
            "the checkpoint's KV scales are for unrotated K and V; with kv_rotation %s "
            "they are ignored and the scales are calibrated from the first prefill",
            rotation,
        )
        return
    first, second = checkpoint_scales
    if first.dim() == 2 and not (per_head and pool.layout.kind == "gqa"):
        first, second = first.amax(dim=1), second.amax(dim=1)  # one scale per layer
    pool.set_scales(_rank_heads(first), _rank_heads(second), source="checkpoint")


def _rank_heads(scales: torch.Tensor) -> torch.Tensor:
    """[layers, kv_heads] -> the columns of this rank's KV heads; [layers] unchanged."""
    if scales.dim() != 2 or parallel.tp_size() == 1:
        return scales
    first, count = parallel.rank_heads(scales.shape[1], "key/value heads", replicas=True)
    return scales[:, first : first + count]


def scales_in_force(pool, rotation: str) -> dict:
    """What /v1/engine/stats and the start-up log report about the KV scales."""
    first_key, second_key = SCALE_KEYS.get(pool.layout.kind, ("k", "v"))
    scales = pool.scales()
    return {
        "source": pool.scale_source,
        "rotation": rotation,
        "granularity": getattr(pool, "granularity", "per_layer"),
        "calibrated_layers": getattr(pool, "calibrated_layers", pool.layout.num_layers),
        "num_layers": pool.layout.num_layers,
        first_key: scales[first_key],
        second_key: scales[second_key],
    }


def scales_document(pool, rotation: str, model: str, margin: float | None = None) -> dict:
    """The scales in force as a scales file (see the module docstring)."""
    doc = {
        "format": SCALES_FORMAT,
        "version": SCALES_VERSION,
        "model": model,
        "kv_cache_dtype": pool.kv_dtype,
        "kv_rotation": rotation,
        "layout": pool.layout.kind,
    }
    in_force = scales_in_force(pool, rotation)
    for key in ("rotation", "calibrated_layers", "num_layers"):
        in_force.pop(key)
    if margin is not None:
        in_force["margin"] = margin
    return {**doc, **in_force}


def write_scales_file(path: str | Path, document: dict) -> None:
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
