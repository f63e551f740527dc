"""Temperature, top-k, top-p and min-p for a batch of rows with per-row parameters.

The definitions (as this engine has always applied them, in this order):
- temperature divides the logits;
- top-k keeps the tokens whose logit is at least the k-th largest (ties with it
  are kept); k of 0, -1 or at least the vocabulary is no cut;
- top-p then sorts the surviving tokens by probability and drops a token when the
  tokens strictly before it already cover top_p;
- min-p then drops a token whose probability is below min_p times the largest.
Top-k and top-p each come down to a per-row threshold on the logits; ties with
the threshold are kept at both cuts, so which tokens survive never depends on
how a sort orders equal logits (bf16 logits tie often).
"""

from __future__ import annotations

import torch

from engine.requests.params import SamplingParams

# Top-p on the CPU looks for its cut among the 64 largest logits first, then the
# 1024, then the 16,384 largest, and sorts only the rows whose nucleus is wider
# still: for a 163,840-token row a full sort costs ~23 ms there, the 64 largest
# ~0.14 ms (`largest`), topk(1024) ~1 ms and topk(16384) ~5 ms, and a language
# model's nucleus nearly always lies inside the first.
TOP_P_CANDIDATES = (64, 1024, 16384)

# `largest` on the CPU: blocks of this many columns, used while k * BLOCK * 8
# fits in the row (beyond that, gathering the blocks costs more than it saves).
SELECT_BLOCK = 128


def rows_index(rows: list[int], count: int, device: torch.device) -> torch.Tensor | None:
    """The rows as an index tensor, or None when they are all `count` rows in order
    (then a batch op works on the tensor itself, with no gather and no copy)."""
    if len(rows) == count:
        return None
    return torch.tensor(rows, dtype=torch.long, device=device)


def filtered_probs(
    logits: torch.Tensor, params: list[SamplingParams], candidates: tuple[int, ...] = ()
) -> torch.Tensor:
    """The probabilities each row samples from, unnormalised (cut tokens are 0).

    `logits` [rows, vocab] float32 is a copy the caller owns; it is divided by
    each row's temperature in place. `candidates` are the widths of the top-p
    searches before a sort (TOP_P_CANDIDATES on the CPU; none: sort at once,
    which on a GPU is cheap and needs no host round trip to learn which rows
    need more).
    """
    rows, vocab = logits.shape
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
    logits.div_(temperature.to(device).unsqueeze(1))
    k_rows = [j for j, p in enumerate(params) if 0 < p.top_k < vocab]
    if k_rows:
        index = rows_index(k_rows, rows, device)
        chosen = logits if index is None else logits[index]
        ks = torch.tensor([params[j].top_k for j in k_rows], dtype=torch.long).to(device)
        kth = largest(chosen, int(max(params[j].top_k for j in k_rows)))[0]
        kth = kth.gather(1, (ks - 1).unsqueeze(1))
        _cut(logits, index, chosen, kth, float("-inf"))
    probs = logits.softmax(-1)
    p_rows = [j for j, p in enumerate(params) if p.top_p < 1]
    if p_rows:
        index = rows_index(p_rows, rows, device)
        chosen = logits if index is None else logits[index]
        chosen_probs = probs if index is None else probs[index]
        top_p = torch.tensor([params[j].top_p for j in p_rows], dtype=logits.dtype).to(device)
        chosen_probs = top_p_probs(chosen, chosen_probs, top_p, candidates)
        if index is None:
            probs = chosen_probs
        else:
            probs[index] = chosen_probs
    m_rows = [j for j, p in enumerate(params) if p.min_p > 0]
    if m_rows:
        index = rows_index(m_rows, rows, device)
        chosen = probs if index is None else probs[index]
        min_p = torch.tensor([params[j].min_p for j in m_rows], dtype=logits.dtype).to(device)
        # Relative to the largest probability, which no earlier cut removes; the
        # ratio does not depend on normalising again after top-k and top-p.
        floor = min_p.unsqueeze(1) * chosen.amax(-1, keepdim=True)
        chosen.masked_fill_(chosen < floor, 0.0)
        if index is not None:
            probs[index] = chosen
    return probs


def _cut(
    logits: torch.Tensor,
    index: torch.Tensor | None,
    chosen: torch.Tensor,
    threshold: torch.Tensor,
    fill: float,
) -> None:
    chosen.masked_fill_(chosen < threshold, fill)
    if index is not None:
        logits[index] = chosen


def largest(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x.topk(k, -1): each row's k largest values, descending, and their columns.

    On the CPU, for k small against the row, by block maxima: the k largest
    values lie in the k blocks with the largest maxima (a block holding one of
    them but outside those k would leave k larger maxima in other blocks, so k
    larger values), so topk runs over the maxima and then over k blocks. For k=20
    of 163,840 columns that is 4x faster than torch.topk, which makes a pass with
    a heap; a GPU's topk is a radix select and needs no help.
    """
    rows, vocab = x.shape
    if x.device.type != "cpu" or vocab % SELECT_BLOCK or k * SELECT_BLOCK * 8 > vocab:
        return x.topk(k, -1)
    blocks = x.reshape(rows, vocab // SELECT_BLOCK, SELECT_BLOCK)
    best = blocks.amax(-1).topk(k, -1).indices
    picked = blocks.gather(1, best.unsqueeze(2).expand(rows, k, SELECT_BLOCK)).flatten(1)
    values, where = picked.topk(k, -1)
    return values, best.gather(1, where // SELECT_BLOCK) * SELECT_BLOCK + where % SELECT_BLOCK


def top_p_probs(
    logits: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor, candidates: tuple[int, ...]
) -> torch.Tensor:
    """`probs` with top-p applied: walking the tokens by falling probability, the
    last one kept is the last whose predecessors' mass is at most top_p; it and
    every token with a logit at least its own (ties) keep their probability, the
    rest become 0. A new tensor, built from the kept columns alone (zeros, then a
    scatter: no comparison over the whole row).

    With `candidates`, the walk first covers only the largest candidates[0] logits;
    the rows whose cut may lie beyond them (their last candidate is kept) are
    walked again over the next width, and at last over a full sort.
    """
    vocab = logits.shape[-1]
    width = min(candidates[0], vocab) if candidates else vocab
    if width == vocab:
        values, order = logits.sort(-1, descending=True)
    else:
        values, order = largest(logits, width)
    mass = probs.gather(1, order)
    before = mass.cumsum(-1) - mass
    drop = before > top_p.unsqueeze(1)
    # The first dropped position ends the kept prefix; none dropped keeps them all.
    kept = torch.where(drop.any(-1), drop.to(torch.uint8).argmax(-1), width)
    threshold = values.gather(1, (kept - 1).unsqueeze(1))
    keep = values >= threshold
    filtered = torch.zeros_like(probs).scatter_(1, order, torch.where(keep, mass, 0.0))
    if width == vocab:
        return filtered
    # Undecided: the last candidate kept, so more tokens (or ties) may follow it,
    # while the candidates still carry mass (a row whose top-k cut left fewer
    # tokens than `width` ends in -inf and is decided).
    undecided = keep[:, -1] & (values[:, -1] > float("-inf"))
    if bool(undecided.any()):
        wide = undecided.nonzero().squeeze(1)
        filtered[wide] = top_p_probs(logits[wide], probs[wide], top_p[wide], candidates[1:])
    return filtered
