"""DeepSeek sparse attention (DSA) over the paged latent pool, in torch (the CPU reference).

A lightning indexer (engine/models/dsa_indexer.py) scores every context
position for every query,

    score[q, t] = sum_h w[q, h] * relu(scale * q_idx[q, h] · k_idx[t])

and each query attends only to its `topk` best-scoring positions among those
it may see (causal). This module turns those scores into what MLA attention
(engine/attention/mla.py) reads, per group of a step (the groups mla.py
itself would cut: the decode sequences together, every other sequence alone):

- nothing, when no query of the group has more than `topk` positions to see:
  every position is selected, so the dense paths, the C decode kernel
  included, are exact and run unchanged;
- for a group of one-token decodes, the selected positions themselves as
  each sequence's context (sorted, so a sequence that keeps all of its
  context attends exactly as the dense path does): the absorbed path and the
  C decode kernel then read only the top-k latent rows;
- for a prefill chunk (or a speculative verification), a mask of the selected
  positions: the attention computes over the whole context with the others
  masked out, which is exact and keeps the chunk's work in one product.

transformers (the reference) takes `topk` over scores with the causal mask
applied, so when a query sees fewer than `topk` positions it keeps all of
them; the same holds here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.mla import MLADims, mla_attention
from engine.attention.sparse_decode import decode_top_k, selected_context

# Queries scored at once: a block's [queries, heads, context] float32 scores stay
# near 64 MB however long the prefill chunk and the context are.
_SCORE_BLOCK_VALUES = 1 << 24


@dataclass(frozen=True)
class Selection:
    """One group's chosen positions: `mask` [B, 1, Q, L] (True = attend) for a group
    with several queries a sequence, or `meta`, the step's metadata with each decode
    sequence's context cut to its selected slots."""

    mask: torch.Tensor | None = None
    meta: AttentionMetadata | None = None


def step_groups(meta: AttentionMetadata) -> list[tuple[torch.Tensor | None, AttentionMetadata]]:
    """The step as mla_attention takes it in pieces: (token indices or None for all,
    their metadata). Built once per step (ragged_groups caches), shared by the layers."""
    if meta.decode_only or len(meta.query_lens) == 1:
        return [(None, meta)]
    return meta.ragged_groups()


def needs_selection(meta: AttentionMetadata, topk: int) -> bool:
    """Whether some query of this group sees more than `topk` positions."""
    return max(meta.context_lens) > topk


def index_scores(
    queries: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, scale: float
) -> torch.Tensor:
    """queries [B, Q, H, D], weights [B, Q, H] (float32), keys [B, L, D] -> [B, Q, L]
    float32, in the reference's order of products (per-head dots, ReLU, weighted sum)."""
    keys_t = keys.float().transpose(-1, -2).unsqueeze(1)  # [B, 1, D, L]
    scores = torch.relu(torch.matmul(queries.float(), keys_t) * scale)  # [B, Q, H, L]
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)


def select_top_k(
    queries: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    meta: AttentionMetadata,
    topk: int,
    scale: float,
) -> Selection:
    """The `topk` best-scoring positions each query of `meta` may see (shapes as
    index_scores'), scored a block of queries at a time."""
    batch, num_queries, heads, _ = queries.shape
    context = keys.shape[1]
    device = keys.device
    positions = torch.arange(context, device=device)
    query_positions = meta.query_positions.to(device)
    k = min(topk, context)
    chosen = torch.empty(batch, num_queries, k, dtype=torch.long, device=device)
    block = max(1, _SCORE_BLOCK_VALUES // max(1, heads * context))
    for start in range(0, num_queries, block):
        part = slice(start, start + block)
        scores = index_scores(queries[:, part], weights[:, part], keys, scale)
        hidden = positions[None, None, :] > query_positions[:, part, None]
        chosen[:, part] = scores.masked_fill_(hidden, float("-inf")).topk(k, dim=-1).indices
    if not meta.decode_only:
        visible = positions[None, None, :] <= query_positions[:, :, None]  # [B, Q, L]
        mask = torch.zeros_like(visible).scatter_(-1, chosen, True) & visible
        return Selection(mask=mask.unsqueeze(1))
    # One query a sequence: its selected positions become its context.
    return Selection(meta=selected_context(meta, chosen[:, 0]))


def paged_decode_selection(
    layer: int,
    queries: torch.Tensor,
    weights: torch.Tensor,
    pool,
    meta: AttentionMetadata,
    topk: int,
    scale: float,
    backend=None,
) -> Selection | None:
    """select_top_k for a decode group (shapes as its), with the scores from a backend that
    reads the keys of `layer` in place on their pages (`index_scores`: the Triton one);
    None where there is no such backend or step, and the keys are gathered for select_top_k."""
    paged = getattr(backend, "index_scores", None) if meta.decode_only else None
    if paged is None:
        return None
    scores = paged(layer, queries[:, 0], weights[:, 0], pool, meta, scale)
    if scores is None:
        return None
    return Selection(meta=selected_context(meta, decode_top_k(scores, topk)))


def sparse_mla_attention(
    layer: int,
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    kv_b_weight: torch.Tensor,
    pool,
    meta: AttentionMetadata,
    dims: MLADims,
    softmax_scale: float,
    selections: list[Selection | None],
    path: str = "auto",
    backend=None,
    latent_grid=None,
) -> torch.Tensor:
    """mla_attention restricted to each group's selection (one per `step_groups(meta)`,
    None where the group attends densely) -> [T, H, v_dim]."""
    groups = step_groups(meta)
    if len(selections) != len(groups):
        raise ValueError(f"{len(selections)} selections for {len(groups)} groups of the step")
    # A kernel may take a cut-down context only if it reads each sequence's context from
    # the metadata's slots (the CPU one does; the Triton one reads them as one-token pages).
    slot_backend = backend if getattr(backend, "mla_decode_reads_context_slots", False) else None
    out = None
    for (tokens, part), chosen in zip(groups, selections, strict=True):
        args = (q_nope, q_rope, latent, k_rope)
        if tokens is not None:
            args = tuple(x[tokens] for x in args)
        kernel = backend
        if chosen is not None and chosen.mask is not None:
            part = replace(part, is_causal_single=False, mask_cache=chosen.mask)
            kernel = None
        elif chosen is not None:
            part, kernel = chosen.meta, slot_backend
        result = mla_attention(
            layer, *args, kv_b_weight, pool, part, dims, softmax_scale, path, kernel, latent_grid
        )
        if tokens is None:
            return result
        if out is None:
            out = q_nope.new_empty(q_nope.shape[0], dims.num_heads, dims.v_dim)
        out[tokens] = result
    return out
