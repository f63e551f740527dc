"""The supported models' shapes, and the sizes at which the launchers' choices change.

Model shapes come from the planner's presets (the published config.json of
each supported checkpoint: Llama/SmolLM2, GLM-4 dense, GLM-4.5/4.6/4.7 MoE,
Kimi K2.x MLA, GLM-5.x MLA with sparse attention) through the engine's own config reader, and per-rank head
counts from the KV layout's own `for_rank`. Where a launcher picks tiles from
a size (rows of a GEMM, pairs of a MoE step, groups of an activation row, the
split count of a decode step), the size ranges are swept through the
launcher's own function and one representative is kept per distinct choice:
nothing here repeats a tile table, so a changed table is checked as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.kv.dtypes import SERVING_KV_DTYPES

TP_DEGREES = (1, 2, 4, 8)
KV_DTYPES = SERVING_KV_DTYPES
# Every supported model is served in BF16 activations; FP8-block GLM and Kimi K2
# checkpoints exist for all of them, INT4 (group 32) only where a preset says so.
ACT_DTYPE = "bfloat16"
DEFAULT_INT4_GROUP = 32


@dataclass(frozen=True)
class ModelShape:
    name: str  # the planner preset
    attention: str  # "gqa" or "mla"
    q_heads: int
    kv_heads: int  # GQA; 1 for MLA (one latent row per token)
    head_dim: int  # GQA
    lora_rank: int  # MLA: kv_lora_rank
    rope_dim: int  # MLA: qk_rope_head_dim
    hidden: int
    intermediate: int  # the dense MLP's
    experts: int  # routed experts; 0 for a dense model
    top_k: int
    expert_inter: int  # moe_intermediate_size
    weight_forms: tuple[str, ...]  # bf16 / fp8 / int4: the forms it is served in
    int4_group: int
    context: int  # the published context limit
    # Rows RMSNorm sees besides the hidden size (MLA's q and latent norms, GLM's q/k norms).
    norm_widths: tuple[int, ...] = ()
    # Rotary widths: head_dim x the config's partial_rotary_factor (MLA: qk_rope_head_dim);
    # when the config names no factor, both model-class defaults (1.0 and 0.5).
    rotary_dims: tuple[int, ...] = ()
    shared_experts: int = 0  # n_shared_experts: their SwiGLU is one dense MLP that wide
    # DeepSeek sparse attention (GLM-5.x, DeepSeek V3.2): the lightning indexer's heads and
    # key width, and the positions a decode query attends to; 0 for a dense-attention model.
    index_heads: int = 0
    index_dim: int = 0
    index_topk: int = 0

    @property
    def widest_input(self) -> int:
        """The widest input a linear layer of this model takes (the dense MLP's down)."""
        return max(self.hidden, self.intermediate, self.expert_inter)

    def tp_degrees(self) -> list[int]:
        return [tp for tp in TP_DEGREES if self.q_heads % tp == 0]

    def rank_heads(self, tp: int) -> tuple[int, int]:
        """(query heads, KV heads) on one tensor-parallel rank, as the pool sizes them."""
        from engine.kv.sizing import KVLayout

        if self.attention == "mla":
            return self.q_heads // tp, 1
        layout = KVLayout(num_layers=1, kind="gqa", num_kv_heads=self.kv_heads, head_dim=1)
        kv = layout.for_rank(tp).num_kv_heads
        return self.q_heads // tp, kv


def _int4_group(quant: dict[str, Any] | None) -> int:
    for group in ((quant or {}).get("config_groups") or {}).values():
        size = (group.get("weights") or {}).get("group_size")
        if size:
            return int(size)
    return DEFAULT_INT4_GROUP


def model_shapes() -> list[ModelShape]:
    """One shape per planner preset, read as the engine reads a config.json."""
    from engine.planner.capacity import preset_names, resolve_model

    shapes = []
    for name in preset_names():
        model = resolve_model(name)
        cfg, preset = model.config, model.preset
        mla = bool(cfg.get("kv_lora_rank"))
        experts = int(cfg.get("n_routed_experts") or 0)
        shapes.append(
            ModelShape(
                name=name,
                attention="mla" if mla else "gqa",
                q_heads=cfg.num_heads,
                kv_heads=1 if mla else cfg.num_kv_heads,
                head_dim=0 if mla else cfg.head_dim,
                lora_rank=int(cfg.get("kv_lora_rank") or 0),
                rope_dim=int(cfg.get("qk_rope_head_dim") or 0),
                hidden=cfg.hidden_size,
                intermediate=int(cfg.get("intermediate_size") or 0),
                experts=experts,
                top_k=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
                expert_inter=int(cfg.get("moe_intermediate_size") or 0) if experts else 0,
                weight_forms=tuple(sorted({preset.weights, "fp8"})),
                int4_group=_int4_group(cfg.quantization),
                context=preset.context,
                norm_widths=_norm_widths(cfg, mla),
                rotary_dims=_rotary_dims(cfg, mla),
                shared_experts=int(cfg.get("n_shared_experts") or 0) if experts else 0,
                index_heads=int(cfg.get("index_n_heads") or 0),
                index_dim=int(cfg.get("index_head_dim") or 0),
                index_topk=int(cfg.get("index_topk") or 0),
            )
        )
    return shapes


def _norm_widths(cfg, mla: bool) -> tuple[int, ...]:
    if mla:
        return tuple(w for w in (cfg.get("q_lora_rank"), cfg.get("kv_lora_rank")) if w)
    return (cfg.head_dim,) if cfg.get("use_qk_norm") else ()


def _rotary_dims(cfg, mla: bool) -> tuple[int, ...]:
    if mla:
        return (int(cfg.get("qk_rope_head_dim") or 0),)
    factor = cfg.rope.get("partial_rotary_factor")
    factors = (1.0, 0.5) if factor is None else (float(factor),)
    return tuple(sorted({int(cfg.head_dim * f) for f in factors}))


@dataclass(frozen=True)
class EngineLimits:
    """The engine settings that shape launches, at their defaults (EngineConfig declares them)."""

    page_size: int
    max_batch: int  # sequences in one decode step
    max_tokens: int  # tokens in one step (a prefill chunk)

    @classmethod
    def defaults(cls) -> EngineLimits:
        from engine.config import EngineConfig

        fields = EngineConfig.model_fields
        return cls(
            page_size=fields["page_size"].default,
            max_batch=fields["max_num_seqs"].default,
            max_tokens=fields["max_num_batched_tokens"].default,
        )


def first_of_each(choice: Callable[[int], Any], sizes) -> list[int]:
    """The smallest size giving each distinct `choice(size)`, in order of first appearance.

    The smallest one is what a launch of that choice most often sees at decode
    (one row gives M = 1, which Triton specializes as a constant).
    """
    seen: dict[str, int] = {}
    for size in sizes:
        seen.setdefault(repr(choice(size)), size)
    return list(seen.values())


def last_of_each(choice: Callable[[int], Any], sizes) -> list[int]:
    """The largest size giving each distinct `choice(size)` (widths: whole groups, no tails)."""
    seen: dict[str, int] = {}
    for size in sizes:
        seen[repr(choice(size))] = size
    return list(seen.values())


def batch_sizes(max_batch: int) -> list[int]:
    """Powers of two up to max_batch, and max_batch: splits only shrink as the batch grows."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return [*sizes, max_batch]


def split_points(
    plan: Callable[[int, int], int], max_batch: int, max_context: int, step: int
) -> list[tuple[int, int]]:
    """(batch, longest context) steps that give each distinct merge width.

    `plan(batch, context)` is the launcher's split count for a step (its own
    `plan_splits` on the GPU's SM count); the merge kernel is compiled per
    power of two of it (BLOCK_S), so one step per power of two is kept.
    Contexts are swept every `step` tokens (the smallest split), which meets
    the rare counts past a power of two too (261 splits at 100,096 tokens,
    batch 1, on an H200).
    """
    seen: dict[int, tuple[int, int]] = {}
    for batch in batch_sizes(max_batch):
        for context in [*range(step, max_context, step), max_context]:
            splits = plan(batch, context)
            seen.setdefault(1 << (splits - 1).bit_length(), (batch, context))
    return [seen[width] for width in sorted(seen)]
