"""The engine's side of speculative decoding: who drafts, how much, and the tally.

Which requests speculate: greedy and sampled ones alike, when the request
asks for it or leaves it to the engine's default. A sampled request's draft is
verified against the tokens its own random stream would draw at each row
(engine/speculative/verifier.py), so it keeps the distribution and, seeded,
the very tokens of plain decoding. Not speculated: requests with presence,
frequency or repetition penalties (each row's penalties depend on the drafted
tokens before it). Constrained decoding speculates (the agent's local requests
always carry a tool-call grammar): a draft is cut to what the grammar allows,
and each verification row gets the mask the grammar gives after the draft
tokens before it (engine/grammar/masks.py `apply_draft_masks`). Who drafts: prompt lookup, or with --speculative mtp the checkpoint's MTP
layers (engine/speculative/mtp_proposer.py), which draft from the target's
hidden states in `after_step`, once each step's tokens are appended. Stop strings,
stop tokens, EOS, max_tokens and logprobs need no exclusion: the engine
appends verified tokens one at a time through the same checks as a plain
decode step and stops where those stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.requests.sequence import ScheduledSequence, Sequence
from engine.speculative.adaptive import AdaptiveK
from engine.speculative.prompt_lookup import PromptLookupProposer
from engine.speculative.proposer import Proposer

if TYPE_CHECKING:
    import torch

METHODS = ("none", "prompt_lookup", "mtp")


def make_proposer(method: str) -> Proposer:
    if method in ("none", "prompt_lookup"):
        # "none" only changes the default: a request may still ask for prompt lookup.
        return PromptLookupProposer()
    if method == "mtp":  # it needs the model and its pool: engine/core/engine_parts.py
        raise ValueError("the mtp proposer is built with the model (MTPProposer)")
    raise ValueError(f"speculative method {method!r}: use one of {METHODS}")


class Speculator:
    def __init__(
        self, method: str, max_draft: int, max_model_len: int, proposer: Proposer | None = None
    ):
        self.proposer = proposer if proposer is not None else make_proposer(method)
        self.default_on = method != "none"
        self.max_draft = max_draft
        self.max_model_len = max_model_len
        self.steps = 0  # verifications run
        self.drafted = 0
        self.accepted = 0

    def wants(self, seq: Sequence) -> bool:
        params = seq.params
        on = params.speculative if params.speculative is not None else self.default_on
        return (
            on
            and not (seq.grammar is not None and seq.grammar.done)
            and params.presence_penalty == 0
            and params.frequency_penalty == 0
            and params.repetition_penalty == 1
        )

    def draft(self, seq: Sequence, limit: int) -> list[int]:
        """Tokens to verify after seq's pending last token, at most `limit` of them."""
        if not self.wants(seq):
            return []
        adaptive = seq.draft_state.get("k")
        if adaptive is None:
            adaptive = seq.draft_state["k"] = AdaptiveK(self.max_draft)
        # Never draft past max_tokens or the context: those tokens could not be kept.
        room = min(
            seq.params.max_tokens - len(seq.output_token_ids) - 1,
            self.max_model_len - seq.num_tokens - 1,
            limit,
        )
        if room <= 0:
            return []
        k = min(adaptive.allow(), room)
        draft = self.proposer.propose(seq, k) if k > 0 else []
        if draft and seq.grammar is not None:
            seq.grammar.sync(seq.output_token_ids)
            draft = draft[: seq.grammar.valid_prefix(draft)]
        return draft

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        seq.draft_state["k"].update(drafted, accepted)
        self.proposer.verified(seq, drafted, accepted)

    def after_step(self, batch: list[ScheduledSequence], hidden: torch.Tensor | None) -> None:
        """After a step's tokens are appended: a proposer that drafts from the target's
        hidden states (MTP) takes those of the speculating sequences still running, each
        with its first row in `hidden`."""
        hook = getattr(self.proposer, "after_step", None)
        if hook is None or hidden is None:
            return
        items, offset = [], 0
        for item in batch:
            if not item.seq.is_finished and self.wants(item.seq):
                items.append((item, offset))
            offset += item.num_tokens
        if items:
            hook(items, hidden)

    def release(self, seq: Sequence) -> None:
        self.proposer.release(seq)
        seq.draft_state.pop("k", None)

    def stats(self) -> dict:
        return {
            "speculative_steps": self.steps,
            "speculative_drafted_tokens": self.drafted,
            "speculative_accepted_tokens": self.accepted,
            "speculative_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
        }
