"""A decode group's DSA selection as attention metadata: each sequence's context cut to the
slots its top-k positions occupy.

For one query a sequence, sparse attention over the selected positions is
dense attention over a shorter context, so the selection becomes the group's
metadata with `context_slots` holding the chosen slots (sorted by position,
so a sequence that keeps its whole context attends in the dense order) and
`context_lens` their counts; every MLA decode path (torch, the C kernel, the
Triton kernel) then runs unchanged. `context_is_selection` tells kernels that
look slots up through page tables to read these as a list
(engine/attention/triton/common.py's step_tables).

Built without reading a device tensor on the host: the counts follow from
the lengths alone. The chosen positions are the top-k of scores that are -inf
exactly at the positions a query may not see, and finite elsewhere, so a
sequence of length n keeps min(n, k) of them, the first min(n, k) once sorted.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.attention.metadata import AttentionMetadata


def decode_top_k(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """scores [B, L] (-inf where not visible) -> the `topk` best positions [B, min(topk, L)]."""
    return scores.topk(min(topk, scores.shape[-1]), dim=-1).indices


def selected_context(meta: AttentionMetadata, chosen: torch.Tensor) -> AttentionMetadata:
    """`meta` (a decode group) with each sequence's context cut to its chosen positions:
    chosen [B, k] from `decode_top_k` (or the same top-k taken another way)."""
    k = chosen.shape[-1]
    kept = [min(length, k) for length in meta.context_lens]
    width = max(kept)
    positions = chosen.sort(dim=-1).values[:, :width]
    slots = meta.context_slots.gather(1, positions.to(meta.context_slots.device))
    batch = len(kept)
    lengths = torch.tensor(kept)
    key_padding = None
    if batch > 1:  # as AttentionMetadata.build pads a decode step's shorter contexts
        padding = torch.arange(width)[None, :] >= lengths[:, None]
        key_padding = padding.view(batch, 1, 1, width).to(meta.slot_mapping.device)
    return replace(
        meta,
        context_slots=slots,
        context_lens=kept,
        query_positions=(lengths - 1).view(batch, 1),
        is_causal_single=False,
        key_padding=key_padding,
        context_len_tensor=None,
        mask_cache=None,
        groups_cache=None,
        context_is_selection=True,
    )
