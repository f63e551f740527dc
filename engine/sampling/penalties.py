"""Repetition, presence and frequency penalties, applied in place to the rows that have them.

Conventions (as vLLM applies OpenAI's and CTRL's penalties, and as this engine
always has): nothing is penalised before the first generated token; the
repetition penalty divides a positive logit (multiplies a negative one) of every
token seen in the prompt or the output; then the frequency penalty subtracts
`frequency_penalty * count` and the presence penalty `presence_penalty` for each
token the output holds, counted over the output only.
"""

from __future__ import annotations

import torch

from engine.requests.sequence import Sequence


def has_penalties(seq: Sequence) -> bool:
    p = seq.params
    return bool(seq.output_token_ids) and (
        p.presence_penalty != 0 or p.frequency_penalty != 0 or p.repetition_penalty != 1
    )


@torch.inference_mode()
def apply_penalties_(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Penalise, in place, row j of `logits` [rows, vocab] for seqs[j] (rows without
    penalties are left alone). Only the (row, token) entries that a penalty touches
    are read and written, so the work grows with the tokens seen, not the vocabulary."""
    device, vocab = logits.device, logits.shape[-1]
    # Per-row penalty values (neutral where a row has none), indexed by each entry's row.
    repetition = torch.ones(logits.shape[0], dtype=logits.dtype)
    frequency = torch.zeros(logits.shape[0], dtype=logits.dtype)
    presence = torch.zeros(logits.shape[0], dtype=logits.dtype)
    seen_rows, seen_ids, out_rows, out_ids = [], [], [], []
    for j, seq in enumerate(seqs):
        if not has_penalties(seq):
            continue
        p = seq.params
        if p.repetition_penalty != 1:
            # The set on the host: a long prompt repeats most of its tokens, so the
            # distinct ids are what is worth sending.
            seen = list(set(seq.token_ids))
            seen_rows.append(torch.full((len(seen),), j, dtype=torch.long))
            seen_ids.append(torch.tensor(seen, dtype=torch.long))
            repetition[j] = p.repetition_penalty
        if p.presence_penalty or p.frequency_penalty:
            out_rows.append(torch.full((len(seq.output_token_ids),), j, dtype=torch.long))
            out_ids.append(torch.tensor(seq.output_token_ids, dtype=torch.long))
            frequency[j] = p.frequency_penalty
            presence[j] = p.presence_penalty
    if seen_rows:
        rows, ids = torch.cat(seen_rows).to(device), torch.cat(seen_ids).to(device)
        penalty = repetition.to(device)[rows]
        values = logits[rows, ids]
        logits[rows, ids] = torch.where(values > 0, values / penalty, values * penalty)
    if out_rows:
        # Counts on the device: one key per (row, token), counted by torch.unique.
        keys = torch.cat(out_rows).to(device) * vocab + torch.cat(out_ids).to(device)
        keys, counts = torch.unique(keys, return_counts=True)
        rows, ids = keys // vocab, keys % vocab
        change = frequency.to(device)[rows] * counts.to(logits.dtype) + presence.to(device)[rows]
        logits[rows, ids] -= change
