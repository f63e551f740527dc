"""One request's grammar state: an xgrammar matcher that follows its output tokens.

The invariant is simple: the matcher has accepted exactly the request's
output tokens. Sampling keeps it (a token is accepted when it is sampled and
appended in the same step), and `sync` restores it from the output itself
before every mask, so no path can leave the two apart:

- preemption: the scheduler frees the pages and recomputes prompt plus
  output later, but the output tokens stay, so the matcher stays too (sync
  finds nothing to do);
- output tokens taken back or replaced: sync rolls the matcher back to
  where the two part and accepts the rest;
- speculative decoding: a draft is cut to the part the grammar allows
  (`valid_prefix`), and its verification rows get one mask each
  (`fill_draft`); both leave the matcher where they found it, and the
  verified tokens are accepted one by one as they are appended;
- stop, abort, finish: the matcher is dropped with the sequence.

A token the grammar rejects cannot be sampled (its logit is -inf); if one is
accepted anyway (a bug), the request is failed rather than left producing
text the grammar no longer describes.
"""

from __future__ import annotations

import torch
import xgrammar as xgr

from engine.grammar.spec import GrammarError


class RequestGrammar:
    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: list[int], prefix: str = ""):
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids)
        # The prefix is the prompt's, not output tokens: rollbacks never reach back into it.
        if prefix and not self.matcher.accept_string(prefix):
            raise GrammarError(f"the answer's beginning {prefix[:40]!r} does not fit the grammar")
        self.accepted: list[int] = []  # the output tokens the matcher has taken
        self.error: str | None = None
        # Asked of every constrained row each step; the matcher's answer changes only
        # when it takes or gives back a token, so it is kept rather than asked again.
        self._terminated = False

    @property
    def num_accepted(self) -> int:
        return len(self.accepted)

    @property
    def terminated(self) -> bool:
        """The grammar accepted a stop token: the output is complete."""
        return self._terminated

    @property
    def done(self) -> bool:
        return self.error is not None or self.terminated

    def accept(self, token: int) -> None:
        if self.error is not None:
            return
        if self.matcher.accept_token(int(token)):
            self.accepted.append(int(token))
            self._terminated = self.matcher.is_terminated()
        else:
            self.error = f"token {token} was sampled but the grammar does not allow it"

    def sync(self, output_token_ids: list[int]) -> None:
        """Make the matcher's accepted tokens equal the request's output tokens."""
        accepted = self.accepted
        if len(accepted) == len(output_token_ids) and (
            not accepted or accepted[-1] == output_token_ids[-1]
        ):
            return  # every step but the first after a change
        common = 0
        for mine, theirs in zip(accepted, output_token_ids, strict=False):
            if mine != theirs:
                break
            common += 1
        if common < len(accepted):
            self.matcher.rollback(len(accepted) - common)
            del accepted[common:]
            self._terminated = self.matcher.is_terminated()
            self.error = None  # a rejected token was never accepted; what is left is sound
        for token in output_token_ids[common:]:
            self.accept(token)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order, the grammar allows after the output so far.

        A token that would end the grammar ends the count before it: the
        model's own next token says that, and a verification row after an
        ended grammar would have no mask."""
        if self.done:
            return 0
        taken = 0
        for token in tokens:
            if not self.matcher.accept_token(int(token)):
                break
            if self.matcher.is_terminated():
                self.matcher.rollback(1)
                break
            taken += 1
        if taken:
            self.matcher.rollback(taken)
        return taken

    def fill_draft(self, bitmask: torch.Tensor, draft: list[int]) -> None:
        """Row j of `bitmask`: the tokens allowed after the output and draft[:j], for every
        j up to len(draft). The draft must be a `valid_prefix` one."""
        for row, token in enumerate(draft):
            self.matcher.fill_next_token_bitmask(bitmask, row)
            if not self.matcher.accept_token(int(token)):
                self.matcher.rollback(row)
                raise GrammarError(f"drafted token {token} does not fit the grammar")
        self.matcher.fill_next_token_bitmask(bitmask, len(draft))
        if draft:
            self.matcher.rollback(len(draft))
