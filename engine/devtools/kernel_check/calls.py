"""The launcher calls of one deployment, on meta tensors shaped as the engine shapes them.

Each function calls the engine's own launchers (the ones the attention
backend, the packed linear layers and the MoE block call on a GPU) with meta
tensors of the dtypes and shapes the engine passes, once per size at which a
launcher's own config function changes its choice (shapes.py). Run under
`planning_for(gpu)` and plan.recording, the launches are recorded instead of
run; nothing here chooses a tile.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.devtools.kernel_check.shapes import (
    EngineLimits,
    ModelShape,
    first_of_each,
    last_of_each,
    split_points,
)
from engine.kv.pool_base import STORAGE_DTYPES

BF16 = torch.bfloat16
KV_STORAGE = STORAGE_DTYPES  # FP8 pages are e4m3 bytes (engine/kv/pool_base.py)


def meta(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _tables(batch: int, context: int, query_len: int, page_size: int):
    from engine.attention.triton.common import StepTables

    pages = -(-context // page_size)
    lengths = meta(batch, dtype=torch.int32)
    return StepTables(page_size, meta(batch, pages, dtype=torch.int32), lengths, lengths,
                      lengths, context, query_len)  # fmt: skip


def gqa_attention(shape: ModelShape, tp: int, kv: str, limits: EngineLimits) -> None:
    """KV write, split decode (one step per merge width) and prefill, as the backend calls them."""
    from engine.attention.triton.decode import gqa_decode, split_plan
    from engine.attention.triton.kv_write import write_gqa
    from engine.attention.triton.prefill import prefill_attention

    q_heads, kv_heads = shape.rank_heads(tp)
    dim, page = shape.head_dim, limits.page_size
    tokens = limits.max_tokens
    storage = meta(tokens + page, 2, kv_heads, dim, dtype=KV_STORAGE[kv])
    scales = meta(kv_heads, dtype=torch.float32)
    slots = meta(tokens, dtype=torch.long)
    write_gqa(storage, slots, meta(tokens, kv_heads, dim), meta(tokens, kv_heads, dim),
              scales, scales)  # fmt: skip

    def decode(q, tables, fp8_dot):
        gqa_decode(q, storage, tables, scales, scales, dim**-0.5, fp8_dot=fp8_dot)

    _decode_steps(kv, split_plan, kv_heads, q_heads, dim, storage, shape, limits, decode)
    q = meta(tokens, q_heads, dim)
    tables = _tables(1, shape.context, tokens, page)
    prefill_attention(q, storage, tables, scales, scales, dim**-0.5)
    fused_rope_write(shape, tp, kv, limits)


def fused_rope_write(shape: ModelShape, tp: int, kv: str, limits: EngineLimits) -> None:
    """Rotary + K/V rotation + KV write in one kernel (rope_write.py), as the backend calls it
    for GQA layers: every rotary width in both layouts (the model class's choice), with and
    without the Hadamard rotation (`--kv-rotation`), at each token tile (decode, prefill)."""
    from engine.attention.triton.rope_write import rope_rotate_write, rope_write_tiles
    from engine.kv.rotation import hadamard_block_size

    q_heads, kv_heads = shape.rank_heads(tp)
    dim = shape.head_dim
    storage = meta(limits.max_tokens + limits.page_size, 2, kv_heads, dim, dtype=KV_STORAGE[kv])
    scales = meta(kv_heads, dtype=torch.float32) if kv == "fp8_e4m3" else None
    for tokens in first_of_each(rope_write_tiles, range(1, limits.max_tokens + 1)):
        q, k, v = meta(tokens, q_heads + 2 * kv_heads, dim).split([q_heads, kv_heads, kv_heads], 1)
        positions = slots = meta(tokens, dtype=torch.long)
        for rotary_dim in shape.rotary_dims:
            table = meta(shape.context, rotary_dim // 2, dtype=torch.float32)
            for interleaved in (False, True):
                for block in (None, hadamard_block_size(dim)):
                    rope_rotate_write(q, k, v, positions, table, table, rotary_dim, interleaved,
                                      block, storage, slots, scales, scales)  # fmt: skip


def mla_attention(shape: ModelShape, tp: int, kv: str, limits: EngineLimits) -> None:
    """Latent write and absorbed MLA decode (one step per merge width), as the backend calls them."""
    from engine.attention.triton.kv_write import write_mla
    from engine.attention.triton.mla_decode import mla_decode, split_plan

    heads, _ = shape.rank_heads(tp)
    lora, rope, page = shape.lora_rank, shape.rope_dim, limits.page_size
    width = lora + rope
    tokens = limits.max_batch  # decode steps: one token per sequence
    storage = meta(limits.max_tokens + page, width, dtype=KV_STORAGE[kv])
    scales = meta(2, dtype=torch.float32) if kv == "fp8_e4m3" else None
    write_mla(storage, meta(tokens, dtype=torch.long), meta(tokens, lora), meta(tokens, rope),
              scales)  # fmt: skip

    scale = (shape.head_dim or width) ** -0.5  # any float: a runtime argument

    def decode(q, tables, fp8_dot):
        mla_decode(q, storage, tables, lora, 1.0, 1.0, scale, fp8_dot=fp8_dot)

    _decode_steps(kv, split_plan, heads, heads, width, storage, shape, limits, decode)


def dsa_decode(shape: ModelShape, tp: int, kv: str, limits: EngineLimits) -> None:
    """DeepSeek sparse attention's decode, as the Triton backend runs it: the indexer's scores
    over its paged keys (in BF16 for every cache dtype: engine/kv/dsa_layout.py; the indexer
    is replicated, so its heads do not split across ranks), then MLA decode over each
    sequence's selected slots, read as one-token pages, index_topk at most a sequence."""
    from engine.attention.triton.index_scores import paged_index_scores
    from engine.kv.dsa_layout import index_key_dtype

    page, tokens = limits.page_size, limits.max_tokens
    keys = meta(tokens + page, shape.index_dim, dtype=KV_STORAGE[index_key_dtype(kv)])
    for batch in (1, limits.max_batch):  # the launch's config does not depend on either
        queries = meta(batch, shape.index_heads, shape.index_dim)
        weights = meta(batch, shape.index_heads, dtype=torch.float32)
        tables = _tables(batch, shape.context, 1, page)
        paged_index_scores(queries, weights, keys, tables, shape.index_dim**-0.5)
    selected = replace(shape, context=min(shape.index_topk, shape.context))
    mla_attention(selected, tp, kv, replace(limits, page_size=1))


def _decode_steps(kv, split_plan, planned_heads, q_heads, width, storage, shape, limits, decode):
    """A decode launcher at one step per merge width, for each loop it has: the launcher's
    own choice (None: FP8 pages on e4m3 tensor cores where the GPU has them) and, for FP8
    pages, the widening loop (False). The loops tile the context differently, so each plans
    its own split points with the launcher's `split_plan(batch, planned_heads, context,
    device, fp8_dot=...)`; `decode(q, tables, fp8_dot)` launches."""
    from engine.attention.triton.common import MIN_SPLIT_TOKENS, choose_fp8_dot

    for fp8_dot in (None, False) if kv == "fp8_e4m3" else (None,):
        used = choose_fp8_dot(meta(1, q_heads, width), storage, fp8_dot)

        def plan(batch: int, context: int, used: bool = used) -> int:
            return split_plan(batch, planned_heads, context, storage.device, fp8_dot=used)[0]

        for batch, context in split_points(plan, limits.max_batch, shape.context,
                                           MIN_SPLIT_TOKENS):  # fmt: skip
            tables = _tables(batch, context, 1, limits.page_size)
            decode(meta(batch, q_heads, width), tables, fp8_dot)


def packed_linears(shape: ModelShape, form: str, limits: EngineLimits) -> None:
    """The packed linear layers' kernels (FP8-block with its activation quantizer; W4A16)."""
    from engine.gpu_kernels import fp8_block_gemm, w4a16
    from engine.gpu_kernels.fp8_act_quant import groups_per_program, quantize_activations_triton
    from engine.gpu_kernels.layout import FP8_BLOCK, INT4_VALUES_PER_WORD, cdiv
    from engine.kv.quant import FP8_DTYPE

    rows = range(1, limits.max_tokens + 1)
    k = n = shape.hidden
    if form == "fp8":
        scale_inv = meta(cdiv(n, FP8_BLOCK), cdiv(k, FP8_BLOCK), dtype=torch.float32)
        for m in first_of_each(fp8_block_gemm.tiles, rows):
            fp8_block_gemm.fp8_block_linear(meta(m, k), meta(n, k, dtype=FP8_DTYPE), scale_inv)
        widths = range(FP8_BLOCK, shape.widest_input + 1, FP8_BLOCK)
        for width in last_of_each(lambda w: groups_per_program(cdiv(w, FP8_BLOCK), FP8_BLOCK),
                                  widths):  # fmt: skip
            quantize_activations_triton(meta(1, width))
    elif form == "int4":
        group = shape.int4_group
        packed = meta(n, cdiv(k, INT4_VALUES_PER_WORD), dtype=torch.int32)
        scales = meta(n, cdiv(k, group))
        for m in first_of_each(w4a16.tiles, rows):
            w4a16.w4a16_gemm(meta(m, k), packed, scales, group)


def _experts(shape: ModelShape, form: str):
    from engine.gpu_kernels.layout import FP8_BLOCK, INT4_VALUES_PER_WORD, cdiv
    from engine.gpu_kernels.moe_weights import DenseExperts, Fp8BlockExperts, Int4Experts
    from engine.kv.quant import FP8_DTYPE

    e, h, i = shape.experts, shape.hidden, shape.expert_inter
    if form == "fp8":
        return Fp8BlockExperts(
            meta(e, 2 * i, h, dtype=FP8_DTYPE),
            meta(e, 2 * cdiv(i, FP8_BLOCK), cdiv(h, FP8_BLOCK), dtype=torch.float32),
            meta(e, h, i, dtype=FP8_DTYPE),
            meta(e, cdiv(h, FP8_BLOCK), cdiv(i, FP8_BLOCK), dtype=torch.float32),
        )
    if form == "int4":
        g, per_word = shape.int4_group, INT4_VALUES_PER_WORD
        return Int4Experts(
            meta(e, 2 * i, cdiv(h, per_word), dtype=torch.int32),
            meta(e, 2 * i, cdiv(h, g)),
            meta(e, h, cdiv(i, per_word), dtype=torch.int32),
            meta(e, h, cdiv(i, g)),
            intermediate=i,
            group_size=g,
        )
    return DenseExperts(meta(e, 2 * i, h), meta(e, h, i))


def fused_moe(shape: ModelShape, form: str, limits: EngineLimits) -> None:
    """Gate/up and down grouped GEMMs, once per block height `block_m_for` picks."""
    from engine.gpu_kernels.fused_moe import block_m_for, moe_down, moe_gate_up
    from engine.gpu_kernels.moe_align import MoeBlocks, moe_capacity

    if not shape.experts:
        return
    experts, e, k = _experts(shape, form), shape.experts, shape.top_k
    tokens_range = range(1, limits.max_tokens + 1)
    for tokens in first_of_each(lambda t: block_m_for(t * k, e), tokens_range):
        pairs = tokens * k
        block_m = block_m_for(pairs, e)
        capacity = moe_capacity(pairs, e, block_m)
        blocks = MoeBlocks(meta(capacity, dtype=torch.int32),
                           meta(capacity // block_m, dtype=torch.int32), block_m, pairs, k)  # fmt: skip
        inter = moe_gate_up(meta(tokens, shape.hidden), blocks, experts)
        moe_down(inter, blocks, experts, meta(tokens, k, dtype=torch.float32))


# The activation dtypes the engine serves in (engine/execution/rank_model.resolve_dtype).
LAYER_OP_DTYPES = (torch.bfloat16, torch.float32)


class _MetaRotary:
    """A RotaryEmbedding's tables as the layer ops read them (layer_ops.RotaryTables)."""

    def __init__(self, rotary_dim: int, interleaved: bool, positions: int):
        self.rotary_dim, self.interleaved = rotary_dim, interleaved
        self.cos = self.sin = meta(positions, rotary_dim // 2, dtype=torch.float32)


def layer_ops(shape: ModelShape, dtype: torch.dtype, limits: EngineLimits) -> None:
    """Norms (with the residual add), SwiGLU and rotary through GpuLayerOps, as the layers call
    them: the hidden and the model's other norm widths, every rank's MLP widths, both rotary
    layouts (the layout is the model class's choice, not the config's) on q and k views."""
    from engine.layers.gpu_layer_ops import GPU_LAYER_OPS as ops

    tokens, hidden = limits.max_tokens, shape.hidden
    x = meta(tokens, hidden, dtype=dtype)
    ops.rms_norm(x, meta(hidden, dtype=dtype), 1e-6)
    ops.add_rms_norm(x, meta(tokens, hidden, dtype=dtype), meta(hidden, dtype=dtype), 1e-6)
    for width in shape.norm_widths:
        ops.rms_norm(meta(tokens, width, dtype=dtype), meta(width, dtype=dtype), 1e-6)
    widths = {shape.intermediate, shape.expert_inter, shape.expert_inter * shape.shared_experts}
    for tp in shape.tp_degrees():
        for width in sorted(w // tp for w in widths if w and w % tp == 0):
            ops.silu_mul(meta(tokens, 2 * width, dtype=dtype))
    q_heads, kv_heads = shape.rank_heads(1)
    head_dim = shape.head_dim or shape.rope_dim
    qk = meta(tokens, q_heads + kv_heads, head_dim, dtype=dtype)
    positions = meta(tokens, dtype=torch.long)
    for rotary_dim in shape.rotary_dims:
        for interleaved in (False, True):
            rotary = _MetaRotary(rotary_dim, interleaved, shape.context)
            ops.rope_(qk, positions, rotary, None)
