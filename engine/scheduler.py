"""Continuous batching: which sequences run this step, and how many tokens each.

Each step has a token budget. Running sequences go first (a decode costs one
token, a prefill in progress takes a chunk of what is left), then waiting
sequences are admitted in arrival order while the budget, the sequence limit
and free pages allow. When a running sequence needs a page and none is free,
the most recently arrived running sequence is preempted: its pages are freed
and it goes back to the head of the queue to be recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.kv.pages import PageAllocator
from engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_tokens: int

    @property
    def reaches_end(self) -> bool:
        """True when this chunk ends at the sequence's last token, so it samples."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
    ):
        self.allocator = allocator
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @staticmethod
    def _chunk(seq: Sequence, budget: int) -> int:
        return min(seq.num_uncomputed, budget, seq.max_chunk or budget)

    def _pages_needed(self, seq: Sequence, num_tokens: int) -> int:
        total = seq.num_computed_tokens + num_tokens
        return max(0, -(-total // self.page_size) - len(seq.pages))

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        needed = self._pages_needed(seq, num_tokens)
        if not self.allocator.can_allocate(needed):
            return False
        seq.pages.extend(self.allocator.allocate(needed))
        return True

    def free(self, seq: Sequence) -> None:
        self.allocator.release(seq.pages)
        seq.pages = []

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> list[ScheduledSequence]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        # Running sequences in arrival order; the newest are preempted first.
        queue = sorted(self.running, key=lambda s: s.arrival)
        while queue and budget > 0:
            seq = queue.pop(0)
            num_tokens = self._chunk(seq, budget)
            while not self._grow(seq, num_tokens):
                victim = queue.pop() if queue else None
                if victim is None:
                    # Nothing else to evict: this sequence waits for pages itself.
                    self._preempt(seq)
                    break
                self._preempt(victim)
            else:
                scheduled.append(ScheduledSequence(seq, num_tokens))
                budget -= num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_tokens = self._chunk(seq, budget)
            if not self._grow(seq, num_tokens):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSequence(seq, num_tokens))
            budget -= num_tokens
        return scheduled

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.free(seq)
