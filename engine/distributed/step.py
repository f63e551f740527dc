"""What rank 0 sends the other ranks each step, and what a worker rebuilds from it.

A step is described by what ModelRunner.run reads of each scheduled
sequence: the tokens this step feeds the model (the pending tokens, plus a
speculative draft), the position of the first of them (the tokens already
in the cache), the page table up to the step's last position, the token
count, the draft, and whether the chunk ends at the sequence's last token
(it then has a sampling row). A hybrid model's sequence also names its
recurrent-state slot, and the prefix-cache snapshot entries the step loads
its state from or saves it to: the scheduler on rank 0 hands them out, and
every rank keeps its own heads' states in the same slots and entries.
`want` names the scheduled indexes whose whole chunk's logits rank 0 wants: the output head runs collectives, so every rank
must compute the same rows of it. Nothing else crosses: sampling, stop checks
and the prefix cache stay on rank 0, and the pages a prefix-cache hit reuses
already hold every rank's shard of their K/V, because every rank ran the
steps that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.host.memory_advice import step_running

STEP = "step"
PING = "ping"  # keeps an idle group inside its collective timeout
PING_INTERVAL_S = 10.0  # how often rank 0 pings an idle group
SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class SequenceSlice:
    token_ids: list[int]  # this step's input tokens, the draft included
    start: int  # num_computed_tokens: the position of token_ids[0]
    pages: list[int]  # page table, up to the page of the step's last position
    num_tokens: int
    draft: list[int]
    reaches_end: bool
    state_slot: int | None = None  # hybrid models only (engine/kv/state_slots.py)
    load_snapshot: int | None = None
    save_snapshot: int | None = None


@dataclass(frozen=True, slots=True)
class StepMessage:
    kind: str
    sequences: list[SequenceSlice] = field(default_factory=list)
    want: frozenset[int] = frozenset()


def describe_step(batch, want: set[int], page_size: int) -> StepMessage:
    """Rank 0: the message for this scheduled batch (engine.requests.sequence.ScheduledSequence)."""
    sequences = []
    for item in batch:
        seq = item.seq
        start = seq.num_computed_tokens
        last_page = (start + item.num_tokens - 1) // page_size
        sequences.append(
            SequenceSlice(
                token_ids=item.token_ids(),
                start=start,
                pages=seq.pages[: last_page + 1],
                num_tokens=item.num_tokens,
                draft=list(item.draft),
                reaches_end=item.reaches_end,
                state_slot=seq.state_slot,
                load_snapshot=getattr(item, "load_snapshot", None),
                save_snapshot=getattr(item, "save_snapshot", None),
            )
        )
    return StepMessage(STEP, sequences, frozenset(want))


@dataclass(slots=True)
class WorkerSequence:
    """The part of engine.requests.sequence.Sequence the runner reads."""

    num_computed_tokens: int
    pages: list[int]
    state_slot: int | None = None


@dataclass(slots=True)
class WorkerItem:
    """A stand-in for engine.requests.sequence.ScheduledSequence that ModelRunner.run accepts."""

    seq: WorkerSequence
    num_tokens: int
    draft: list[int]
    reaches_end: bool
    tokens: list[int]
    load_snapshot: int | None = None
    save_snapshot: int | None = None

    def token_ids(self) -> list[int]:
        return self.tokens


def rebuild_batch(message: StepMessage) -> list[WorkerItem]:
    """A worker: the batch ModelRunner.run takes, from rank 0's message."""
    return [
        WorkerItem(
            seq=WorkerSequence(s.start, s.pages, s.state_slot),
            num_tokens=s.num_tokens,
            draft=s.draft,
            reaches_end=s.reaches_end,
            tokens=s.token_ids,
            load_snapshot=s.load_snapshot,
            save_snapshot=s.save_snapshot,
        )
        for s in message.sequences
    ]


def run_step(runner, batch, want: set[int], deterministic: bool):
    """One forward step; in deterministic mode on one thread, so no reduction is split
    across threads differently for different batch shapes."""
    with step_running():  # background page work waits for a quiet moment
        if not deterministic:
            return runner.run(batch, want)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return runner.run(batch, want)
        finally:
            torch.set_num_threads(threads)
