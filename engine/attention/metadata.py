"""What attention needs to know about one forward step, built once per step by the runner.

Tokens of all sequences in a step are flattened into one [T, ...] batch. For
attention each sequence's queries are laid out in a padded [B, Q] grid and its
context (cached prefix plus this step's tokens) in a padded [B, L] grid of
cache slots. Padding positions point at a valid slot and are masked out, so
they are never written and never affect a result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot for each new token
    query_index: torch.Tensor  # [B, Q] flat token index of each query (pads -> 0)
    output_index: torch.Tensor  # [T] position in the flattened [B*Q] grid of each token
    context_slots: torch.Tensor  # [B, L] cache slots of each sequence's context
    query_positions: torch.Tensor  # [B, Q] absolute position of each query, on the CPU
    is_causal_single: bool  # one sequence, no cached prefix: plain causal attention
    query_lens: list[int]
    context_lens: list[int]
    decode_only: bool = False  # every sequence has exactly one query this step
    key_padding: torch.Tensor | None = None  # [B, 1, 1, L] True at padding (decode only)
    context_len_tensor: torch.Tensor | None = None  # context_lengths(), built on first use
    mask_cache: torch.Tensor | None = None  # mask, built on first use
    groups_cache: list | None = None  # ragged_groups(), built on first use
    # context_slots hold a DSA selection (engine/attention/sparse_mla.py): each decode
    # sequence's chosen slots, sorted by position but not whole pages, so kernels that find
    # a position's slot through a page table must read them as a list instead.
    context_is_selection: bool = False

    @property
    def mask(self) -> torch.Tensor | None:
        """[B, 1, Q, L] True where a query may attend; None when all may (one fresh
        sequence, or one decode). Built on first use: the C and Triton kernels apply
        the causal limit themselves, and at 2,048 queries over 8,000 positions the
        mask is 16 MB per step that they would never read."""
        if self.is_causal_single or (len(self.query_lens) == 1 and self.decode_only):
            return None
        if self.mask_cache is None:
            # A query at absolute position p attends to context positions <= p.
            # Pad rows have p = 0, so they see slot position 0 and never a NaN row.
            positions = torch.arange(max(self.context_lens))
            mask = (positions[None, None, :] <= self.query_positions[:, :, None]).unsqueeze(1)
            self.mask_cache = mask.to(self.slot_mapping.device)
        return self.mask_cache

    def ragged_groups(self) -> list[tuple[torch.Tensor, AttentionMetadata]]:
        """The step cut into sub-steps that waste no padding: (the tokens' flat indices,
        their metadata) for the decode sequences together (one query each), then each
        other sequence alone. For attention paths that pad every sequence to the
        longest query and context: in a mixed step, 15 decode tokens beside a
        512-token prefill chunk would otherwise each attend as 512 padded queries.
        Built once per step, shared by the layers."""
        if self.groups_cache is None:
            starts = [0]
            for q_len in self.query_lens:
                starts.append(starts[-1] + q_len)
            decode = [b for b, q_len in enumerate(self.query_lens) if q_len == 1]
            others = [[b] for b, q_len in enumerate(self.query_lens) if q_len != 1]
            self.groups_cache = [
                self._group(members, starts) for members in ([decode] if decode else []) + others
            ]
        return self.groups_cache

    def _group(self, members: list[int], starts: list[int]):
        tokens = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in members])
        device = self.slot_mapping.device
        tokens = tokens.to(device)
        meta = AttentionMetadata.build(
            [self.query_lens[b] for b in members],
            [self.context_lens[b] for b in members],
            self.slot_mapping[tokens],
            [self.context_slots[b, : self.context_lens[b]] for b in members],
            device,
        )
        return tokens, meta

    def context_lengths(self) -> torch.Tensor:
        """context_lens as an int64 CPU tensor (built once)."""
        if self.context_len_tensor is None:
            self.context_len_tensor = torch.tensor(self.context_lens, dtype=torch.int64)
        return self.context_len_tensor

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        slot_mapping: torch.Tensor,
        context_slots: list[torch.Tensor],
        device: torch.device,
    ) -> AttentionMetadata:
        """`context_lens[b]` counts the sequence's tokens up to and including this step's."""
        batch = len(query_lens)
        max_q = max(query_lens)
        max_l = max(context_lens)
        if max_q == 1:
            return cls._build_decode(context_lens, slot_mapping, context_slots, device)
        query_index = torch.zeros(batch, max_q, dtype=torch.long)
        query_pos = torch.zeros(batch, max_q, dtype=torch.long)
        output_index = torch.empty(sum(query_lens), dtype=torch.long)
        slots = torch.zeros(batch, max_l, dtype=torch.long)
        start = 0
        for b, (q_len, ctx_len) in enumerate(zip(query_lens, context_lens, strict=True)):
            query_index[b, :q_len] = torch.arange(start, start + q_len)
            query_pos[b, :q_len] = torch.arange(ctx_len - q_len, ctx_len)
            output_index[start : start + q_len] = torch.arange(b * max_q, b * max_q + q_len)
            slots[b, :ctx_len] = context_slots[b]
            start += q_len
        return cls(
            slot_mapping=slot_mapping.to(device),
            query_index=query_index.to(device),
            output_index=output_index.to(device),
            context_slots=slots.to(device),
            query_positions=query_pos,
            is_causal_single=batch == 1 and context_lens[0] == query_lens[0],
            query_lens=list(query_lens),
            context_lens=list(context_lens),
        )

    @classmethod
    def _build_decode(
        cls,
        context_lens: list[int],
        slot_mapping: torch.Tensor,
        context_slots: list[torch.Tensor],
        device: torch.device,
    ) -> AttentionMetadata:
        """build's tensors for a step of one query a sequence, in fewer operations: after a
        decode step has streamed the weights through the caches each small tensor
        operation runs cold, and build's per-sequence loop was a tenth of a millisecond
        of a one-sequence step. One sequence's context needs no padding: its slots are
        used as given (read-only)."""
        batch, max_l = len(context_lens), max(context_lens)
        rows = torch.arange(batch)
        if batch == 1:
            slots = context_slots[0][:max_l].to(torch.long).reshape(1, max_l)
        else:
            slots = torch.zeros(batch, max_l, dtype=torch.long)
            for b, ctx_len in enumerate(context_lens):
                slots[b, :ctx_len] = context_slots[b]
        key_padding = None
        if batch > 1:
            lengths = torch.tensor(context_lens)
            key_padding = (torch.arange(max_l)[None, :] >= lengths[:, None]).view(
                batch, 1, 1, max_l
            )
            key_padding = key_padding.to(device)
        return cls(
            decode_only=True,
            key_padding=key_padding,
            slot_mapping=slot_mapping.to(device),
            query_index=rows.view(batch, 1).to(device),
            output_index=rows.to(device),
            context_slots=slots.to(device),
            query_positions=torch.tensor(context_lens).sub_(1).view(batch, 1),
            is_causal_single=batch == 1 and context_lens[0] == 1,
            query_lens=[1] * batch,
            context_lens=list(context_lens),
        )
