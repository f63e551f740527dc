"""Memory planner: KV bytes per token and KV capacity for a model on a GPU set, without weights.

Per GPU of one tensor-parallel replica:

    KV budget = GPU memory x memory fraction - weights on that GPU - activation reserve
    capacity  = capacity_tokens(KV budget, layout, dtype, page size, tp)   # engine.kv.sizing

The capacity is per replica: every rank of a replica holds its share of the same
tokens (GQA heads split across ranks, the MLA latent replicated on each), so one
rank's budget decides how many tokens the replica keeps. The engine sizes its
own pool with the same `capacity_tokens`.

Defaults, shown with every plan: memory fraction 0.9 (vLLM's
gpu_memory_utilization; SGLang computes about 0.897 on an H200), the other 10%
being CUDA context, NCCL buffers and allocator slack; an activation reserve of
10 GiB per GPU for prefill activations, CUDA graphs and sampler buffers
(SGLang keeps at least 10 GiB for these on cards over 60 GB); GPU memory as
nvidia-smi reports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from engine.errors import EngineError, ModelError
from engine.kv.dtypes import SERVING_KV_DTYPES
from engine.kv.sizing import KVLayout, capacity_tokens, kv_bytes_per_token
from engine.model_files.hybrid_layers import kv_layer_count, recurrent_state_layout
from engine.model_files.model_config import ModelConfig, load_config, parse_config
from engine.model_files.store import DEFAULT_MODEL_NAME
from engine.model_files.store import resolve_model as store_resolve
from engine.models.dsa_config import dsa_kv_layout, is_dsa_config
from engine.planner.presets import PRESETS, Preset
from engine.planner.weight_bytes import (
    WeightScheme,
    checkpoint_weight_bytes,
    computed_weight_bytes,
    mtp_layers,
    num_experts,
    scheme_from_config,
    scheme_named,
)

GIB = 1024**3
MIB = 1024**2
# memory.total as nvidia-smi reports it (MiB): H100 SXM 80GB, H200 141GB, B200 180GB.
GPU_MEMORY_MIB = {"h100": 81559, "h200": 143771, "b200": 183359}
KV_DTYPES = SERVING_KV_DTYPES
DEFAULT_MEMORY_FRACTION = 0.9
DEFAULT_ACTIVATION_RESERVE_GIB = 10.0
DEFAULT_PAGE_SIZE = 16  # EngineConfig.page_size


class PlanError(EngineError):
    """The planner was asked about a model or a GPU set it cannot size."""


@dataclass(frozen=True)
class PlanInputs:
    gpu: str = "h200"
    num_gpus: int = 8
    tp: int | None = None  # defaults to num_gpus
    gpu_memory_gib: float | None = None  # overrides the GPU's memory
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    activation_reserve_gib: float = DEFAULT_ACTIVATION_RESERVE_GIB
    context: int | None = None  # defaults to the model's context limit
    weights: str | None = None  # bf16 | fp8 | int4 overrides the checkpoint's form
    page_size: int = DEFAULT_PAGE_SIZE


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    config: ModelConfig
    source: str  # "preset", "config.json" or "folder"
    preset: Preset | None = None
    folder: Path | None = None


def preset_names() -> list[str]:
    return list(PRESETS)


def resolve_model(spec: str) -> ResolvedModel:
    """A preset name, a config.json path, a model folder, a .gguf file, or a model name
    from `resident models`."""
    if spec in PRESETS:
        preset = PRESETS[spec]
        return ResolvedModel(spec, parse_config(preset.config), "preset", preset=preset)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        # Its folder (config, tokenizer, the file linked) is made once without reading
        # the weights: engine/model_files/store.py.
        try:
            path = store_resolve(str(path))
        except ModelError as err:
            raise PlanError(str(err)) from None
    elif path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise PlanError(f"{path} is not a valid config.json: {err}") from None
        if not isinstance(raw, dict):
            raise PlanError(f"{path} is not a config.json object")
        return ResolvedModel(path.name, parse_config(raw, path=path.parent), "config.json")
    if not path.is_dir():
        try:
            path = store_resolve(spec)
        except ModelError as err:
            if spec == DEFAULT_MODEL_NAME:  # not pulled yet: the preset has its shape
                raise PlanError(f"{err} Or plan the preset: --model smollm2-135m.") from None
            raise PlanError(
                f"unknown model {spec!r}: pass a preset ({', '.join(PRESETS)}), "
                "a config.json path, or a model folder with config.json"
            ) from None
    return ResolvedModel(path.name, load_config(path), "folder", folder=path)


def kv_layout_for(cfg: ModelConfig) -> KVLayout:
    """The KV layout the engine's model declares: MLA latent rows, else GQA K and V.

    MLA keeps kv_lora_rank + qk_rope_head_dim values per token and layer (the
    DeepseekV3 config's `head_dim` is the rope width and plays no part); with
    DeepSeek sparse attention (V3.2, GLM-5.x) the indexer's keys come beside it.
    """
    if is_dsa_config(cfg):
        return dsa_kv_layout(cfg)
    if cfg.get("kv_lora_rank"):
        return KVLayout(
            num_layers=kv_layer_count(cfg),  # a hybrid's full-attention layers alone
            kind="mla",
            latent_dim=int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"]),
        )
    return KVLayout(
        num_layers=cfg.num_layers, kind="gqa", num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim
    )


def recurrent_state_bytes(cfg: ModelConfig, tp: int = 1) -> int:
    """What one request's recurrent state takes on each GPU, with the convolution state in
    BF16; 0 without one. KDA's heads (and their convolution channels) split over the TP
    ranks like attention heads (engine/models/kimi_linear_attention.py)."""
    layout = recurrent_state_layout(cfg)
    if layout is None:
        return 0
    heads = -(-layout.num_heads // tp)
    share = replace(
        layout, num_heads=heads, conv_channels=layout.conv_channels // layout.num_heads * heads
    )
    return share.bytes_per_sequence(2)


def _concurrent_requests(
    capacity: int, budget: int, context: int, per_token: int, state: int
) -> int:
    """Requests of `context` tokens the budget holds: the KV capacity's share, and for a
    hybrid also each request's fixed recurrent state."""
    if not state:
        return capacity // context
    return max(0, budget) // (context * per_token + state)


def _exact(value: float) -> Fraction:
    return Fraction(str(value))


def _weight_scheme(model: ResolvedModel, override: str | None) -> WeightScheme:
    if override:
        return scheme_named(override)
    if model.preset is not None:
        return scheme_named(model.preset.weights)
    return scheme_from_config(model.config)


def _gpu_bytes(inputs: PlanInputs) -> tuple[str, int]:
    if inputs.gpu_memory_gib is not None:
        if inputs.gpu_memory_gib <= 0:
            raise PlanError("--gpu-memory must be positive")
        return f"{inputs.gpu_memory_gib:g} GiB", int(_exact(inputs.gpu_memory_gib) * GIB)
    gpu = inputs.gpu.lower()
    if gpu not in GPU_MEMORY_MIB:
        raise PlanError(
            f"unknown GPU {inputs.gpu!r}: use one of {', '.join(GPU_MEMORY_MIB)} or --gpu-memory GiB"
        )
    return gpu, GPU_MEMORY_MIB[gpu] * MIB


def _check_parallelism(inputs: PlanInputs, cfg: ModelConfig) -> tuple[int, int, list[str]]:
    tp = inputs.tp or inputs.num_gpus
    if inputs.num_gpus < 1 or tp < 1:
        raise PlanError("--num-gpus and --tp must be at least 1")
    if inputs.num_gpus % tp:
        raise PlanError(f"--num-gpus {inputs.num_gpus} is not a multiple of --tp {tp}")
    warnings = []
    if cfg.num_heads % tp:
        warnings.append(
            f"{cfg.num_heads} attention heads do not split evenly over TP={tp}; "
            "engines refuse this split"
        )
    return tp, inputs.num_gpus // tp, warnings


def plan(spec: str | ResolvedModel, inputs: PlanInputs | None = None) -> dict[str, Any]:
    """The plan for one model as a JSON-ready dict (see `resident plan --json`)."""
    inputs = inputs or PlanInputs()
    model = spec if isinstance(spec, ResolvedModel) else resolve_model(spec)
    cfg = model.config
    if not 0 < inputs.memory_fraction <= 1:
        raise PlanError("--memory-fraction must be in (0, 1]")
    if inputs.activation_reserve_gib < 0:
        raise PlanError("--activation-reserve must not be negative")
    gpu_name, gpu_bytes = _gpu_bytes(inputs)
    tp, replicas, warnings = _check_parallelism(inputs, cfg)
    try:
        layout = kv_layout_for(cfg)
        scheme = _weight_scheme(model, inputs.weights)
        weights = computed_weight_bytes(cfg, scheme, tp)
    except (KeyError, TypeError, ValueError) as err:
        raise PlanError(f"{model.name}: cannot size this config ({err})") from None
    if model.folder is not None and inputs.weights is None:
        real = checkpoint_weight_bytes(model.folder, cfg, tp, weights.params)
        if real is not None:
            weights = real
    # Decimal fractions taken exactly (0.9 is 9/10), so a plan is reproducible by hand.
    reserve = int(_exact(inputs.activation_reserve_gib) * GIB)
    usable = int(gpu_bytes * _exact(inputs.memory_fraction))
    budget = usable - weights.per_gpu_bytes - reserve
    if budget <= 0:
        warnings.append(
            f"the weights ({weights.per_gpu_bytes / GIB:.1f} GiB per GPU) and the activation "
            "reserve leave no memory for KV: add GPUs or quantize the weights"
        )
    context = inputs.context or (model.preset.context if model.preset else None)
    context = context or cfg.max_position_embeddings
    per_token = {d: kv_bytes_per_token(layout, d) for d in KV_DTYPES}
    per_gpu = {d: kv_bytes_per_token(layout, d, tp) for d in KV_DTYPES}
    capacity = {d: capacity_tokens(budget, layout, d, inputs.page_size, tp) for d in KV_DTYPES}
    if 0 < capacity["bf16"] < context:
        warnings.append(f"one {context}-token request does not fit the BF16 KV pool")
    ratio = capacity["fp8_e4m3"] / capacity["bf16"] if capacity["bf16"] else None
    state_bytes = recurrent_state_bytes(cfg, tp)
    requests = {
        d: _concurrent_requests(capacity[d], budget, context, per_gpu[d], state_bytes)
        for d in KV_DTYPES
    }
    experts = num_experts(cfg)
    return {
        "model": model.name,
        "source": model.source,
        "checkpoint": model.preset.checkpoint if model.preset else str(cfg.path or ""),
        "architecture": cfg.architecture,
        "kv_layout": {
            "kind": layout.kind,
            "layers": layout.num_layers,
            **(
                {"latent_dim": layout.latent_dim}
                if layout.kind == "mla"
                else {"kv_heads": layout.num_kv_heads, "head_dim": layout.head_dim}
            ),
            # DSA: the layers that also keep an indexer key of index_dim values per token.
            **(
                {"index_layers": len(layout.index_layers), "index_dim": layout.index_dim}
                if getattr(layout, "index_layers", ())
                else {}
            ),
        },
        "gpu": {"name": gpu_name, "memory_bytes": gpu_bytes, "count": inputs.num_gpus},
        "tp": tp,
        "replicas": replicas,
        "weights": {
            "format": scheme.name,
            "description": scheme.describe(experts > 0),
            "params": weights.params,
            "total_bytes": weights.total_bytes,
            "per_gpu_bytes": weights.per_gpu_bytes,
            "from": weights.source,
        },
        "kv_budget_bytes_per_gpu": max(budget, 0),
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_per_gpu": per_gpu,
        "capacity_tokens": capacity,
        "capacity_tokens_all_replicas": {d: capacity[d] * replicas for d in KV_DTYPES},
        "fp8_over_bf16": round(ratio, 4) if ratio else None,
        "context_tokens": context,
        "recurrent_state_bytes_per_request": state_bytes,
        "concurrent_requests": requests,
        "concurrent_requests_all_replicas": {d: requests[d] * replicas for d in KV_DTYPES},
        "assumptions": _assumptions(inputs, cfg, model, tp),
        "warnings": warnings,
    }


def _assumptions(inputs: PlanInputs, cfg: ModelConfig, model: ResolvedModel, tp: int) -> dict:
    notes = [
        "KV budget per GPU = GPU memory x memory_fraction - weights per GPU - activation_reserve",
        "capacity is per replica (tokens one engine instance holds); "
        "GQA KV heads split over TP ranks (at least one per rank), the MLA latent is replicated",
        "weights sharded 1/TP except norms, routers, MLA q_a/kv_a projections and MTP eh_proj "
        "(replicated) and GQA k/v (ceil(kv_heads/TP) heads per rank)",
        "weights are kept on the GPU in the stated form (as SGLang and vLLM serve them)",
    ]
    if recurrent_state_bytes(cfg, tp):
        notes.append(
            "hybrid: KV pages for the full-attention layers only; each request also holds a "
            f"fixed recurrent state of {recurrent_state_bytes(cfg, tp):,} bytes per GPU "
            "(float32 delta-rule state, BF16 convolution state, its heads split over TP), "
            "counted in concurrent_requests, not in capacity_tokens"
        )
    if mtp_layers(cfg):
        notes.append(
            f"{mtp_layers(cfg)} next-token-prediction (MTP) layer: weights counted (the checkpoint "
            "carries it; MTP speculative decoding loads it), KV not (plain decoding skips it; "
            "--speculative mtp adds one layer's KV per MTP layer to every token)"
        )
    if model.preset is not None:
        notes.extend(model.preset.notes)
    return {
        "memory_fraction": inputs.memory_fraction,
        "activation_reserve_gib": inputs.activation_reserve_gib,
        "page_size": inputs.page_size,
        "gpu_memory": "as given" if inputs.gpu_memory_gib else "nvidia-smi memory.total",
        "tp": tp,
        "notes": notes,
    }


def _gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def _count(value: int) -> str:
    return f"{value / 1e9:.1f}B" if value >= 1e9 else f"{value / 1e6:.1f}M"


def render_plans(plans: list[dict[str, Any]]):
    """A rich Table of plans that share one GPU set, plus the assumption lines under it."""
    from rich.table import Table

    first = plans[0]
    gpu = first["gpu"]
    title = (
        f"KV capacity per replica: {gpu['count']} x {gpu['name']} "
        f"({_gib(gpu['memory_bytes'])} each), TP={first['tp']}, {first['replicas']} replica(s)"
    )
    table = Table(title=title, title_justify="left")
    for header in (
        "model",
        "weights",
        "weights/GPU",
        "KV/GPU",
        "KV B/token bf16",
        "fp8",
        "B/token/GPU bf16",
        "tokens bf16",
        "tokens fp8",
        "fp8/bf16",
        "context",
        "requests bf16",
        "fp8",
    ):
        justify = "left" if header in ("model", "weights") else "right"
        table.add_column(header, justify=justify)
    for p in plans:
        per_token, cap, req = (
            p["kv_bytes_per_token"],
            p["capacity_tokens"],
            p["concurrent_requests"],
        )
        ratio = p["fp8_over_bf16"]
        table.add_row(
            p["model"],
            p["weights"]["format"],
            _gib(p["weights"]["per_gpu_bytes"]),
            _gib(p["kv_budget_bytes_per_gpu"]),
            f"{per_token['bf16']:,}",
            f"{per_token['fp8_e4m3']:,}",
            f"{p['kv_bytes_per_token_per_gpu']['bf16']:,}",
            f"{cap['bf16']:,}",
            f"{cap['fp8_e4m3']:,}",
            f"{ratio:.2f}x" if ratio else "-",
            f"{p['context_tokens']:,}",
            f"{req['bf16']:,}",
            f"{req['fp8_e4m3']:,}",
        )
    return table


def assumption_lines(plans: list[dict[str, Any]]) -> list[str]:
    """What the numbers assume, said once, then per-model weights, notes and warnings."""
    a = plans[0]["assumptions"]
    lines = [
        f"memory fraction {a['memory_fraction']}, activation reserve "
        f"{a['activation_reserve_gib']:g} GiB per GPU, page size {a['page_size']}, "
        f"GPU memory: {a['gpu_memory']}"
    ]
    lines += a["notes"][:4]
    for p in plans:
        w = p["weights"]
        lines.append(
            f"{p['model']}: {_count(w['params'])} params, {_gib(w['total_bytes'])} of weights "
            f"(from {w['from']}): {w['description']}"
        )
        lines += [f"{p['model']}: {note}" for note in p["assumptions"]["notes"][4:]]
        lines += [f"{p['model']}: warning: {warning}" for warning in p["warnings"]]
    return lines
