"""Turns the last-position logits of a batch into next tokens and their logprobs.

All the work happens where the logits are (a GPU, or the CPU), batched over
rows; only the chosen ids and the logprob values a request asked for cross to
the host (`to_host`). Per step: grammar masks for constrained rows
(engine.grammar.masks), then one argmax over the plain greedy rows; the other
rows (sampled, or greedy with penalties) are gathered into one copy (on the CPU
a few MB of rows at a time: CPU_CHUNK_BYTES), penalised
(engine.sampling.penalties), and the sampled ones filtered with per-row
temperature/top-k/top-p/min-p (engine.sampling.filters) and drawn by inverse
CDF from one host uniform per row (engine.sampling.draw, which says how seeds
map to tokens). Python loops run over rows only to read parameters and
generators and to advance grammars, never over the vocabulary.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.argmax import row_argmax
from engine.requests.sequence import Sequence, TokenLogprob
from engine.sampling.draw import inverse_cdf, uniforms
from engine.sampling.filters import TOP_P_CANDIDATES, filtered_probs, rows_index
from engine.sampling.penalties import apply_penalties_, has_penalties


def to_host(tensor: torch.Tensor) -> list:
    """The one way sampling results leave the device: small tensors ([rows] ids and
    the requested logprob values), never a vocabulary-wide row."""
    return tensor.tolist()


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """First maximum of each row; float32 CPU rows take the C kernel (measured
    faster than torch.argmax: per-row calls cost as much as a layer at batch 16)."""
    return row_argmax(logits) if logits.device.type == "cpu" else logits.argmax(-1)


def logprob_tensors(
    logits: torch.Tensor, tokens: torch.Tensor, top_n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the logits' device: the log-softmax value of each row's token [rows], and
    each row's `top_n` largest values [rows, top_n] with their ids."""
    logprobs = torch.log_softmax(logits.float(), -1)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    values, ids = logprobs.topk(top_n, -1)  # top_n may be 0: empty [rows, 0]
    return chosen, values, ids


def _logprob_entries(
    tokens: list[int], chosen: list[float], values: list[float], ids: list[int], tops: list[int]
) -> list[TokenLogprob]:
    width = max(tops, default=0)
    entries = []
    for j, (token, top_n) in enumerate(zip(tokens, tops, strict=True)):
        start = j * width
        top = dict(zip(ids[start : start + top_n], values[start : start + top_n], strict=True))
        entries.append(TokenLogprob(token_id=token, logprob=chosen[j], top=top))
    return entries


@torch.inference_mode()
def token_logprobs(logits: torch.Tensor, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    """Logprob entries for row j of `logits` choosing tokens[j] (the rows after
    len(tokens) are ignored); computed on the logits' device."""
    rows = logits[: len(tokens)]
    index = torch.tensor(tokens, dtype=torch.long).to(rows.device)
    chosen, values, ids = logprob_tensors(rows, index, top_n)
    floats = to_host(torch.cat([chosen, values.flatten()]))
    count = len(tokens)
    return _logprob_entries(
        tokens, floats[:count], floats[count:], to_host(ids.flatten()), [top_n] * count
    )


def token_logprob(logprobs: torch.Tensor, token: int, top_n: int) -> TokenLogprob:
    """The entry for one row of log-probabilities already computed (the per-row
    form of token_logprobs, for callers that hold a single row)."""
    top: dict[int, float] = {}
    if top_n > 0:
        values, ids = torch.topk(logprobs, top_n)
        top = dict(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token_id=token, logprob=float(logprobs[token]), top=top)


# On the CPU the rows that are not plain greedy go through in chunks of about
# this many bytes of logits: a [64, 163840] float32 temporary (42 MB) is above
# glibc's mmap threshold, so each of the several a step makes is mapped and
# page-faulted afresh, and it does not stay in cache between passes. Chunking
# changes no row's result: every step is row by row.
CPU_CHUNK_BYTES = 4 << 20


def _chunks(rows: list[int], logits: torch.Tensor) -> list[list[int]]:
    if logits.device.type != "cpu":
        return [rows] if rows else []
    size = max(1, CPU_CHUNK_BYTES // (logits.shape[-1] * logits.element_size()))
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def _put(dst: torch.Tensor, index: torch.Tensor | None, src: torch.Tensor) -> None:
    if index is None:
        dst.copy_(src)
    else:
        dst[index] = src


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    @torch.inference_mode()  # the runner's logits are inference tensors
    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence]
    ) -> list[tuple[int, TokenLogprob | None]]:
        """One token per row; a seeded request draws from its own generator.

        Rows of constrained requests are masked first, where the logits are
        (engine.grammar.masks), and each sampled token advances its grammar.
        Logprobs are the model's own distribution: before penalties, filters and
        grammar masks, as OpenAI and vLLM report them.
        """
        logits = logits.float()
        count, device = logits.shape[0], logits.device
        unmasked: dict[int, torch.Tensor] = {}
        if any(seq.grammar is not None for seq in seqs):
            from engine.grammar.masks import apply_grammar_masks  # xgrammar only when used

            unmasked = apply_grammar_masks(logits, seqs)
        is_plain = [seq.params.greedy and not has_penalties(seq) for seq in seqs]
        plain = [i for i, flag in enumerate(is_plain) if flag]
        rest = [i for i, flag in enumerate(is_plain) if not flag]
        tokens = torch.empty(count, dtype=torch.long, device=device)
        if plain:
            # One argmax over the plain greedy rows, on the logits themselves when
            # they are all of them (the common batch).
            index = rows_index(plain, count, device)
            if index is None:
                tokens = argmax_rows(logits)
            else:
                tokens[index] = argmax_rows(logits[index])
        for chunk in _chunks(rest, logits):
            self._sample_rest(logits, seqs, chunk, tokens)
        with_logprobs = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
        chosen, infos = self._to_host_with_logprobs(logits, seqs, tokens, with_logprobs, unmasked)
        results: list[tuple[int, TokenLogprob | None]] = []
        for i, (token, seq) in enumerate(zip(chosen, seqs, strict=True)):
            if seq.grammar is not None:
                seq.grammar.accept(token)
            results.append((token, infos.get(i)))
        return results

    def _sample_rest(
        self, logits: torch.Tensor, seqs: list[Sequence], rest: list[int], tokens: torch.Tensor
    ) -> None:
        """Tokens of `rest`, rows that are not plain greedy: one gathered copy of
        them, penalised in place, then argmax (greedy with penalties) or a draw."""
        device = logits.device
        index = rows_index(rest, logits.shape[0], device)
        work = logits.clone() if index is None else logits[index]
        group = [seqs[i] for i in rest]
        apply_penalties_(work, group)
        greedy = [j for j, seq in enumerate(group) if seq.params.greedy]
        sampled = [j for j, seq in enumerate(group) if not seq.params.greedy]
        local = torch.empty(len(rest), dtype=torch.long, device=device)
        if greedy:
            inner = rows_index(greedy, len(rest), device)
            _put(local, inner, argmax_rows(work if inner is None else work[inner]))
        if sampled:
            inner = rows_index(sampled, len(rest), device)
            params = [group[j].params for j in sampled]
            # The CPU looks for the top-p cut among candidates first; a GPU sorts
            # (fast there) rather than wait on the host to learn which rows need it.
            candidates = TOP_P_CANDIDATES if device.type == "cpu" else ()
            probs = filtered_probs(work if inner is None else work[inner], params, candidates)
            u = uniforms([group[j].generator or self.generator for j in sampled])
            _put(local, inner, inverse_cdf(probs, u.to(device)))
        _put(tokens, index, local)

    def _to_host_with_logprobs(
        self,
        logits: torch.Tensor,
        seqs: list[Sequence],
        tokens: torch.Tensor,
        rows: list[int],
        unmasked: dict[int, torch.Tensor],
    ) -> tuple[list[int], dict[int, TokenLogprob]]:
        """The tokens, and the logprob entries of the rows that asked for them, in
        one transfer of ids and one of values."""
        if not rows:
            return to_host(tokens), {}
        tops = [seqs[i].params.logprobs for i in rows]
        parts = []
        for chunk in _chunks(rows, logits):
            index = rows_index(chunk, logits.shape[0], logits.device)
            own = logits if index is None else logits[index]
            if any(i in unmasked for i in chunk):
                # Constrained rows: their copies from before the grammar mask.
                own = own.clone() if index is None else own
                for j, i in enumerate(chunk):
                    if i in unmasked:
                        own[j] = unmasked[i]
            picked = tokens if index is None else tokens[index]
            parts.append(logprob_tensors(own, picked, max(tops)))
        chosen, values, ids = (torch.cat(column) for column in zip(*parts, strict=True))
        ints = to_host(torch.cat([tokens, ids.flatten()]))
        floats = to_host(torch.cat([chosen, values.flatten()]))
        count = len(seqs)
        entries = _logprob_entries(
            [ints[i] for i in rows], floats[: len(rows)], floats[len(rows) :], ints[count:], tops
        )
        return ints[:count], dict(zip(rows, entries, strict=True))
