"""Turns the last-position logits of a batch into next tokens and their logprobs."""

from __future__ import annotations

import torch

from engine.cpu_kernels.argmax import row_argmax
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence, TokenLogprob


def apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if not seq.output_token_ids or (
        p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
    ):
        return logits
    logits = logits.clone()
    if p.repetition_penalty != 1:
        seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(
            values > 0, values / p.repetition_penalty, values * p.repetition_penalty
        )
    if p.presence_penalty or p.frequency_penalty:
        ids = torch.tensor(seq.output_token_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(ids, minlength=logits.shape[-1]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p on one row of float32 logits."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens strictly before it already cover top_p.
        drop = (probs.cumsum(-1) - probs) > params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    if params.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def token_logprob(logprobs: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    top: dict[int, float] = {}
    if top_n > 0:
        values, ids = torch.topk(logprobs, top_n)
        top = dict(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id=token, logprob=float(logprobs[token]), top=top)


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> list[tuple[int, TokenLogprob | None]]:
        """One token per row; a seeded request draws from its own generator.

        Rows of constrained requests are masked first, where the logits are
        (engine.grammar.masks), and each sampled token advances its grammar.
        """
        logits = logits.float()
        unmasked: dict[int, torch.Tensor] = {}
        if any(seq.grammar is not None for seq in seqs):
            from engine.grammar.masks import apply_grammar_masks  # xgrammar only when used

            unmasked = apply_grammar_masks(logits, seqs)
        logits = logits.cpu()
        # One argmax over the batch: per-row calls cost as much as a layer at batch 16.
        greedy = any(seq.params.greedy for seq in seqs)
        argmax = row_argmax(logits).tolist() if greedy else []
        results: list[tuple[int, TokenLogprob | None]] = []
        for index, (row, seq) in enumerate(zip(logits, seqs, strict=True)):
            params = seq.params
            adjusted = apply_penalties(row, seq)
            if params.greedy:
                token = argmax[index] if adjusted is row else int(torch.argmax(adjusted))
            else:
                probs = filter_logits(adjusted, params).softmax(-1)
                generator = seq.generator or self.generator
                token = int(torch.multinomial(probs, 1, generator=generator))
            if seq.grammar is not None:
                seq.grammar.accept(token)
            info = None
            if params.logprobs is not None:
                # Logprobs of the model's own distribution (before any grammar mask),
                # as OpenAI and vLLM report them.
                own = unmasked[index].cpu() if index in unmasked else row
                info = token_logprob(torch.log_softmax(own, -1), token, params.logprobs)
            results.append((token, info))
        return results
