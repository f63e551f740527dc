"""Greedy verification: keep the drafted tokens the target model would have chosen.

The target ran over [last token, d1 .. dk] in one pass, so row i of its logits
is its distribution after d1..di. Its greedy choice t_i at each row is what
plain decoding would emit there, provided every earlier draft token matched.
The output is the longest prefix of the draft that agrees with t, plus the
target's own next token after it: always at least one token (a rejected draft
still yields what a plain decode step would have), and exactly plain greedy
decoding's tokens, whatever the draft.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.argmax import row_argmax


def accept_greedy(draft: list[int], targets: list[int]) -> list[int]:
    """Tokens to emit given the draft and the target's argmax at each of len(draft)+1 rows."""
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
