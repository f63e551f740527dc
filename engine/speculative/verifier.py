"""Verification: keep the drafted tokens the target model would have produced.

The target ran over [last token, d1 .. dk] in one pass, so row i of its logits
is its distribution after d1..di. At each row we compute the token plain
decoding would emit there, t_i, provided every earlier draft token matched.
The output is the longest prefix of the draft that agrees with t, plus the
target's own next token after it: always at least one token (a rejected draft
still yields what a plain decode step would have), and exactly plain
decoding's tokens, whatever the draft.

- Greedy requests: t_i is the row's argmax.
- Sampled requests: t_i is the token the sampler would draw at that position:
  the same filters (temperature, top-k, top-p, min-p) and the same inverse-CDF
  draw with the uniform plain decoding would take there, the next one of the
  request's stream (engine/sampling/draw.py). The uniforms of rows past the
  first disagreement are given back (the stream is rewound and advanced by
  the tokens kept), so a seeded request gives the same tokens with and without
  speculation. A draft token is then kept with probability p(d) under the
  target's filtered distribution, which is what rejection sampling against a
  one-token draft distribution (a drafter that copies) accepts: lossless, and
  no residual distribution to sample, since a rejected row's t_i is already a
  draw from p.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.argmax import row_argmax
from engine.requests.params import SamplingParams
from engine.sampling.draw import inverse_cdf, uniforms
from engine.sampling.filters import TOP_P_CANDIDATES, filtered_probs


def accept_prefix(draft: list[int], targets: list[int]) -> list[int]:
    """Tokens to emit given the draft and the target's token at each of len(draft)+1 rows."""
    if len(targets) != len(draft) + 1:
        raise ValueError(f"{len(draft)} drafted tokens need {len(draft) + 1} target rows")
    accepted = 0
    while accepted < len(draft) and draft[accepted] == targets[accepted]:
        accepted += 1
    return targets[: accepted + 1]


def greedy_targets(logits: torch.Tensor) -> list[int]:
    """The target's greedy token at each row, by the same argmax the sampler uses
    (ties resolve the same way as in plain decoding). The argmax runs where the
    logits are; only the ids cross to the host."""
    return row_argmax(logits.float()).tolist()


class SampledTargets:
    """The tokens a sampled request would draw at each row, from uniforms taken
    ahead of its stream; `keep(n)` then leaves the stream as if plain decoding
    had drawn n tokens."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator):
        rows, device = logits.shape[0], logits.device
        self.generator = generator
        self.state = generator.get_state()
        u = uniforms([generator] * rows)  # one draw at a time, as the sampler draws them
        candidates = TOP_P_CANDIDATES if device.type == "cpu" else ()
        probs = filtered_probs(logits.float().clone(), [params] * rows, candidates)
        self.tokens = inverse_cdf(probs, u.to(device)).tolist()

    def keep(self, count: int) -> None:
        self.generator.set_state(self.state)
        uniforms([self.generator] * count)
