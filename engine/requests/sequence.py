"""A request's state as the scheduler and runner see it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.requests.params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    pages: list[int] = field(default_factory=list)
    # Hybrid models: the recurrent-state slot it holds while running (engine/kv/state_slots.py).
    state_slot: int | None = None
    # Hybrid models: a page boundary past the cached prefix it reused where the prefix
    # cache holds its pages but no state; its prefill stops there once so the state
    # can be kept (engine/core/snapshot_points.py). 0: none.
    state_cut: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    generator: torch.Generator | None = None
    num_preemptions: int = 0
    first_token_time: float | None = None
    prompt_text: str | None = None
    cache_salt: str = ""
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    error: str | None = None  # why the engine gave up on it (finish_reason "error")
    max_chunk: int | None = None  # cap on tokens per step (tests of chunking)
    collect_logits: bool = False  # keep every prompt position's logits (scoring)
    collected_logits: list[torch.Tensor] = field(default_factory=list)
    detok: object | None = None  # IncrementalDetokenizer
    grammar: Any = None  # engine.grammar.matcher.RequestGrammar when params.structured is set
    # Speculative decoding's per-sequence state (engine.speculative): draft size, n-gram index.
    draft_state: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    emitted_text_len: int = 0
    emitted_token_len: int = 0

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and not self.output_token_ids


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_tokens: int
    # Speculative decoding: tokens drafted after the pending last token. The step then
    # runs [last token, *draft] (num_tokens = 1 + len(draft)) and verifies every row.
    draft: list[int] = field(default_factory=list)
    # Hybrid models (engine/kv/state_pool.py): the prefix-cache snapshot entry to start
    # from (the first step after a cache hit), and the one to keep the state in after
    # this chunk (it ends on a page boundary worth keeping).
    load_snapshot: int | None = None
    save_snapshot: int | None = None

    @property
    def reaches_end(self) -> bool:
        """True when this chunk ends at the sequence's last token, so it samples."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens

    def token_ids(self) -> list[int]:
        """The tokens this step feeds the model."""
        start = self.seq.num_computed_tokens
        if self.draft:
            return self.seq.token_ids[start:] + self.draft
        return self.seq.token_ids[start : start + self.num_tokens]
