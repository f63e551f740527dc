"""What a drafter implements so the engine can verify its tokens.

The verifier only needs token ids: any source of guesses fits, whether it
copies from the context (prompt lookup), runs a small draft model, or runs a
model's own multi-token-prediction layers (GLM-4.5+, DeepSeek-V3/Kimi). The
two hooks after a verification exist for the stateful ones: a draft model
keeps KV for its guesses and must drop the rejected tail, as the engine does
for the target's pages. A proposer may also have `after_step(items, hidden)`,
called with the target's hidden states once a step's tokens are appended
(the MTP draft's input: engine/speculative/mtp_proposer.py).
"""

from __future__ import annotations

from typing import Protocol

from engine.requests.sequence import Sequence


class Proposer(Protocol):
    name: str

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to k tokens that may follow seq.token_ids; [] when it has no guess."""
        ...

    def verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """After a verification: num_accepted of the num_drafted tokens were kept."""
        ...

    def release(self, seq: Sequence) -> None:
        """The sequence is done: drop whatever state was kept for it."""
        ...
