"""MTP drafts: the checkpoint's multi-token-prediction layer guesses the next token from
the target's hidden state (engine/models/mtp.py says what the layer computes).

When it runs: after every engine step, not at schedule time. A step gives the
target's hidden state h_p of each position p it computed; once the step's
tokens are appended (the sampled token, or the verified draft and the
target's token after it) the token after every such position is known. One
batched MTP pass then runs over exactly those rows, writing the MTP layer's
KV for (h_p, t_{p+1}) at p's slot of the same pages, and the row of each
decoding sequence's last position gives its draft's first token, which
`propose` hands out at the next schedule. So:

- a rejected draft needs no rollback of its own: the pass after a
  verification runs on the kept rows only and rewrites the MTP KV at their
  positions; what a chain wrote past them is overwritten before anything
  reads it (attention at p reads positions up to p, written in order);
- a prefill chunk fills the MTP KV of its positions in the same pass (their
  next tokens are the prompt's): one more decoder layer per prompt token,
  and the lm_head for one row per sequence;
- a preempted sequence recomputes, and the passes of those steps rewrite its
  MTP KV; a draft is tagged with the sequence length it was made for, so a
  stale one is never handed out;
- a cached prefix brings the MTP KV its first owner wrote. The MTP KV at p
  depends on t_{p+1}, so a cached page's last slot holds the owner's next
  token's: a draft may be worse for it, the output never is.

Chained drafts (`num_tokens` > 1): the layer runs again one position further on
its own output g and its own guess, as vLLM chains MTP. Those positions may lie
past the sequence's pages; the pass borrows free pages for them and gives them
back at once (never cached pages: only what the allocator has free).

Drafts are the MTP logits' argmax; the verifier keeps exactly plain decoding's
tokens whatever the draft, greedy or sampled (engine/speculative/verifier.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata
from engine.cpu_kernels.argmax import row_argmax
from engine.kv.pages import PageAllocator
from engine.models.decoder import ForwardContext
from engine.requests.sequence import ScheduledSequence, Sequence


@dataclass
class _MTPState:
    position: int = -1  # seq.num_tokens when the draft was made; only then is it handed out
    draft: tuple[int, ...] = ()
    kept: int = 0  # rows of the last verification that stand (1 + accepted)


@dataclass
class _Rows:
    """One sequence's rows in an MTP pass: positions [first, end) over `pages`."""

    seq: Sequence
    first: int
    end: int
    pages: list[int]


class MTPProposer:
    name = "mtp"

    def __init__(self, runner, allocator: PageAllocator, num_tokens: int = 1):
        if getattr(runner.model, "mtp", None) is None:
            raise ValueError("the model was loaded without its MTP layers (load_mtp)")
        self.model = runner.model
        self.draft_model = runner.model.mtp
        self.pool = runner.pool
        self.backend = runner.backend
        self.page_size = runner.page_size
        self.device = runner.device
        self.allocator = allocator
        self.num_tokens = num_tokens
        runner.keep_hidden = True  # the passes read every step's hidden states
        self.passes = 0  # MTP layer runs (catch-up passes and chain steps)

    # ----- the Proposer interface (engine/speculative/proposer.py) -----------------
    def _state(self, seq: Sequence) -> _MTPState:
        state = seq.draft_state.get(self.name)
        if state is None:
            state = seq.draft_state[self.name] = _MTPState()
        return state

    def propose(self, seq: Sequence, k: int) -> list[int]:
        state = seq.draft_state.get(self.name)
        if k <= 0 or state is None or state.position != seq.num_tokens:
            return []
        return list(state.draft[:k])

    def verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        self._state(seq).kept = 1 + num_accepted

    def release(self, seq: Sequence) -> None:
        seq.draft_state.pop(self.name, None)

    # ----- the pass after each step ------------------------------------------------
    @torch.inference_mode()
    def after_step(self, items: list[tuple[ScheduledSequence, int]], hidden: torch.Tensor) -> None:
        """`items`: the step's speculating, unfinished sequences with the first row of
        each in `hidden` (the target's final hidden states, every row of the step)."""
        groups: list[_Rows] = []
        rows: list[int] = []
        for item, offset in items:
            seq = item.seq
            state = self._state(seq)
            kept = state.kept if item.draft else item.num_tokens
            state.kept = 0
            end = seq.num_computed_tokens
            if kept <= 0 or end >= seq.num_tokens:
                continue
            groups.append(_Rows(seq, end - kept, end, seq.pages))
            rows.extend(range(offset, offset + kept))
        if not groups:
            return
        previous = hidden.index_select(0, torch.tensor(rows, device=hidden.device))
        tokens = [t for g in groups for t in g.seq.token_ids[g.first + 1 : g.end + 1]]
        out = self._run(0, groups, tokens, previous)
        last_rows, drafting, row = [], [], 0
        for g in groups:
            row += g.end - g.first
            if g.seq.num_uncomputed == 1:  # decoding: its next step may verify a draft
                last_rows.append(row - 1)
                drafting.append(g)
        if drafting:
            self._draft(drafting, out[torch.tensor(last_rows, device=out.device)])

    def _draft(self, groups: list[_Rows], hidden: torch.Tensor) -> None:
        """Each sequence's draft: the first token from the pass's last rows, then the
        chain (module docstring); kept for `propose`."""
        drafts = [[token] for token in self._guess(0, hidden)]
        borrowed: list[int] = []
        try:
            chain = self._chain_pages(groups, borrowed)
            live = [i for i, pages in enumerate(chain) if pages is not None]
            if live:
                hidden = hidden[torch.tensor(live, device=hidden.device)]
            for step in range(1, self.num_tokens if live else 1):
                steps = [
                    _Rows(groups[i].seq, groups[i].end + step - 1, groups[i].end + step, chain[i])
                    for i in live
                ]
                hidden = self._run(step, steps, [drafts[i][-1] for i in live], hidden)
                for i, token in zip(live, self._guess(step, hidden), strict=True):
                    drafts[i].append(token)
        finally:
            if borrowed:  # the chain's KV there is never read again
                self.allocator.release(borrowed)
        for g, draft in zip(groups, drafts, strict=True):
            state = self._state(g.seq)
            state.position, state.draft = g.seq.num_tokens, tuple(draft)

    def _chain_pages(self, groups: list[_Rows], borrowed: list[int]) -> list[list[int] | None]:
        """Each sequence's pages for its chain positions, its own plus borrowed free ones
        past them; None where no chain runs (one draft token, or no free page)."""
        if self.num_tokens <= 1:
            return [None] * len(groups)
        pages: list[list[int] | None] = []
        for g in groups:
            last = g.end + self.num_tokens - 2  # the last chain step's position
            needed = last // self.page_size + 1 - len(g.pages)
            if needed > self.allocator.num_free:
                pages.append(None)
                continue
            extra = self.allocator.allocate(needed) if needed > 0 else []
            borrowed.extend(extra)
            pages.append(g.pages + extra)
        return pages

    def _guess(self, step: int, hidden: torch.Tensor) -> list[int]:
        layer = self.draft_model.layer(step)
        logits = self.model.compute_logits(layer.head_input(hidden))
        return row_argmax(logits.float()).tolist()

    def _run(
        self, step: int, groups: list[_Rows], tokens: list[int], previous: torch.Tensor
    ) -> torch.Tensor:
        """MTP layer `step mod n` over the groups' rows, as one batched pass that writes
        its KV at their slots; its output g per row."""
        slot_mapping, context_slots, query_lens, context_lens, positions = [], [], [], [], []
        for g in groups:
            table = torch.tensor(g.pages, dtype=torch.long)
            at = torch.arange(g.end)
            slots = table[at // self.page_size] * self.page_size + at % self.page_size
            slot_mapping.append(slots[g.first :])
            context_slots.append(slots)
            query_lens.append(g.end - g.first)
            context_lens.append(g.end)
            positions.append(at[g.first :])
        meta = AttentionMetadata.build(
            query_lens, context_lens, torch.cat(slot_mapping), context_slots, self.device
        )
        ctx = ForwardContext(pool=self.pool, meta=meta, backend=self.backend)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        embedded = self.model.model.embed_tokens(ids)
        self.passes += 1
        layer = self.draft_model.layer(step)
        return layer(embedded, torch.cat(positions).to(self.device), previous, ctx)
