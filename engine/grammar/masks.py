"""Applying each constrained request's token mask to its row of the batch's logits.

Only rows whose request has a grammar are touched, so unconstrained requests
in the same batch pay nothing and sample exactly as they would alone. The
bitmask (one bit per token: vocab/32 int32 words a row, 6 KB for a 49k
vocabulary) is filled on the CPU by xgrammar and, when the logits live on a
GPU, copied there; xgrammar's kernel then writes -inf into the masked logits
in place. The vocabulary-sized logits never travel to the host for this.

On the CPU, xgrammar's kernel skips words whose 32 tokens are all allowed
but writes masked tokens one by one: inside a JSON string (nearly all
allowed) 16 rows of 49k tokens take 0.1 ms, between JSON values (nearly all
masked) 3.3 ms. A mostly masked row is cheaper the other way round: keep the
few allowed logits, fill the row with -inf, put them back.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import xgrammar as xgr

# Filling masks for many requests at once spreads them over threads; one
# request's mask is filled directly (no thread hand-off for the common case).
_batch_matcher: xgr.BatchGrammarMatcher | None = None


def _batch() -> xgr.BatchGrammarMatcher:
    global _batch_matcher
    if _batch_matcher is None:
        _batch_matcher = xgr.BatchGrammarMatcher(max(1, min(8, (os.cpu_count() or 2) // 2)))
    return _batch_matcher


def constrained_rows(seqs: list[Any]) -> list[int]:
    return [i for i, seq in enumerate(seqs) if seq.grammar is not None and not seq.grammar.done]


@torch.inference_mode()  # the runner's logits are inference tensors: in-place writes need it
def apply_grammar_masks(logits: torch.Tensor, seqs: list[Any]) -> dict[int, torch.Tensor]:
    """Mask, in place, the rows of `logits` whose sequence has a grammar.

    Returns unmasked copies of the constrained rows whose request asked for
    logprobs: those report the model's own distribution, as for any request.
    """
    for i in constrained_rows(seqs):
        seqs[i].grammar.sync(seqs[i].output_token_ids)
    rows = constrained_rows(seqs)  # without any that sync found broken
    if not rows:
        return {}
    raw = {i: logits[i].clone() for i in rows if seqs[i].params.logprobs is not None}
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[-1])
    if len(rows) == 1:
        seqs[rows[0]].grammar.fill(bitmask, rows[0])
    else:
        _batch().batch_fill_next_token_bitmask(
            [seqs[i].grammar.matcher for i in rows], bitmask, rows
        )
    if logits.device.type != "cpu":
        bitmask = bitmask.to(logits.device, non_blocking=True)
    else:
        rows = _apply_sparse_rows(logits, bitmask, rows)
    if rows:
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
    return raw


_BITS = torch.arange(32, dtype=torch.int32)


def _apply_sparse_rows(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> list[int]:
    """Mask the rows whose allowed tokens lie in under half of the bitmask's words;
    return the others (see the module doc)."""
    vocab = logits.shape[-1]
    dense = []
    for row in rows:
        words = bitmask[row]
        used = torch.nonzero(words, as_tuple=True)[0]  # words with any allowed token
        if 2 * len(used) > len(words):
            dense.append(row)
            continue
        # Bit j of word w is token 32*w + j; an arithmetic shift keeps bit 31 readable.
        bits = ((words[used].unsqueeze(-1) >> _BITS) & 1).bool()
        allowed = (used.unsqueeze(-1) * 32 + _BITS)[bits]
        allowed = allowed[allowed < vocab]
        kept = logits[row, allowed]
        logits[row].fill_(float("-inf"))
        logits[row, allowed] = kept
    return dense


@torch.inference_mode()
def apply_draft_masks(logits: torch.Tensor, grammar: Any, draft: list[int]) -> None:
    """Mask, in place, the len(draft)+1 verification rows of one speculating request:
    row j allows what the grammar allows after the output and draft[:j], so each
    row's argmax is what a constrained plain decode step would pick there."""
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[-1])
    grammar.fill_draft(bitmask, draft)
    if logits.device.type != "cpu":
        bitmask = bitmask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1])
