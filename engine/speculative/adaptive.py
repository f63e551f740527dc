"""How many tokens to draft next, per sequence, from how the last drafts fared.

A fully accepted draft says the sequence is copying: draft more next time
(+2, up to the maximum). A rejection says the guess source ran out: draft
less (-1, down to 1). This is the schedule transformers uses for assisted
generation; it tracks a copy that starts and stops within a few steps
without a model of the acceptance rate. A draft whose first token is
rejected twice in a row also pauses drafting for a few steps, so text with
nothing to copy pays for few verifications.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AdaptiveK:
    k_max: int
    k: int = 4
    misses: int = 0  # consecutive drafts rejected at their first token
    pause: int = 0  # decode steps left without drafting

    def __post_init__(self) -> None:
        self.k = max(1, min(self.k, self.k_max))

    def allow(self) -> int:
        """The draft length for this step (0: skip drafting this step)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 2)
        else:
            self.k = max(1, self.k - 1)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= 2:
            self.pause = 4
            self.misses = 0
