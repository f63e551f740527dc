"""One token per row by inverse-CDF sampling from one host uniform per row.

Each sampled row takes one float32 uniform u in [0, 1) from its request's own
CPU generator (`seq.generator`, seeded by the request's `seed`) or, unseeded,
from the engine's. The token is the first, in vocabulary order, whose cumulative
probability exceeds u times the row's total. So a seeded request's tokens depend
only on its own logits and its own stream: not on the rest of the batch, nor on
the device, since the same uniforms reach a CPU and a GPU. (Two devices can
still disagree when their logits differ in rounding and a cumulative sum lands
on the other side of u: a chance of the order of the float32 rounding, 1e-7.)

This changed, once, which token a given seed picks: the sampler used to call
torch.multinomial per row, whose random stream is device-specific (the CPU and
CUDA generators differ) and which needs the whole row on the host. Seeded runs
recorded before the change give other tokens after it; their distribution is
the same.
"""

from __future__ import annotations

import torch

# The cumulative sum runs in two levels: block sums, then one block. A flat
# cumsum over 163,840 columns is a serial scan on the CPU (~0.3 ms a row);
# block sums vectorise, and the scan then covers a few hundred values.
BLOCK = 256


def uniforms(generators: list[torch.Generator]) -> torch.Tensor:
    """One float32 uniform per row from that row's generator, on the host."""
    return torch.cat([torch.rand(1, generator=g) for g in generators])


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of non-negative `probs` [rows, vocab] (unnormalised; at least one
    positive), the first column whose cumulative sum exceeds u * the row's sum.
    int64 [rows] on probs' device; u is [rows] on that device."""
    rows, vocab = probs.shape
    blocks = -(-vocab // BLOCK)
    padded = probs
    if blocks * BLOCK != vocab:
        padded = torch.nn.functional.pad(probs, (0, blocks * BLOCK - vocab))
    grid = padded.view(rows, blocks, BLOCK)
    # Block sums in float32 (a float64 sum converts every element: 20x slower on
    # the CPU), accumulated across blocks in float64.
    cdf = grid.sum(-1).to(torch.float64).cumsum(-1)
    total = cdf[:, -1:]
    target = u.to(torch.float64).unsqueeze(1) * total
    block = _first_above(cdf, target)
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inner = grid.gather(1, block.unsqueeze(2).expand(rows, 1, BLOCK)).squeeze(1)
    inner_cdf = inner.to(torch.float64).cumsum(-1)
    column = _first_above(inner_cdf, target - before)
    return (block * BLOCK + column).squeeze(1)


def _first_above(cdf: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """First index whose cumulative value exceeds target, [rows, 1]. Rounding can put
    target at or past the total (u close to 1); then the last index that adds mass,
    so a token of probability 0 is never chosen."""
    first = torch.searchsorted(cdf, target, right=True)
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous())
    return torch.minimum(first, last)
