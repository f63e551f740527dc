"""A speculative draft after its verification step: keep what the target model agrees
with, give back the rest, and append the kept tokens as plain decode steps would.

The verifier (engine/speculative/verifier.py) decides how much of the draft
stands: the greedy targets' common prefix, or for sampled requests rejection
sampling that keeps the target's distribution. The scheduler then rolls the
sequence's pages back to what is computed, and the speculator learns how well
it drafted.
"""

from __future__ import annotations

import torch

from engine.core.output_processor import OutputProcessor
from engine.core.scheduler import Scheduler
from engine.requests.sequence import ScheduledSequence
from engine.sampling.sampler import token_logprobs
from engine.speculative import Speculator
from engine.speculative.verifier import SampledTargets, accept_prefix, greedy_targets


def accept_draft(
    item: ScheduledSequence,
    logits: torch.Tensor,
    *,
    default_generator: torch.Generator,
    scheduler: Scheduler,
    speculator: Speculator,
    outputs: OutputProcessor,
) -> None:
    """Keep the verified part of `item`'s draft; `logits` holds its 1 + len(draft) rows.
    The kept tokens go through the same stop checks as a plain decode step's, one at a
    time. `default_generator` draws for a sampled request without a seed of its own."""
    seq, draft = item.seq, item.draft
    top_n = seq.params.logprobs
    raw = logits
    if seq.grammar is not None:
        from engine.grammar.masks import apply_draft_masks  # xgrammar only when used

        raw = logits.clone() if top_n is not None else logits  # logprobs: the model's own
        seq.grammar.sync(seq.output_token_ids)
        apply_draft_masks(logits, seq.grammar, draft)
    if seq.params.greedy:
        tokens = accept_prefix(draft, greedy_targets(logits))
    else:
        sampled = SampledTargets(logits, seq.params, seq.generator or default_generator)
        tokens = accept_prefix(draft, sampled.tokens)
        sampled.keep(len(tokens))
    accepted = len(tokens) - 1
    # KV is now valid for the pending token and the accepted draft tokens; the
    # rejected ones' slots are past the end and will be overwritten.
    seq.num_computed_tokens += 1 + accepted
    scheduler.rollback(seq)
    speculator.verified(seq, len(draft), accepted)
    # On the logits' device: only the requested values cross to the host.
    infos = token_logprobs(raw, tokens, top_n) if top_n is not None else None
    for row, token in enumerate(tokens):
        info = infos[row] if infos is not None else None
        if seq.grammar is not None:
            seq.grammar.accept(token)  # as the sampler does for a sampled token
        outputs.append_token(seq, token, info)
        if seq.is_finished:
            break
