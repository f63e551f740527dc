"""Continuous batching: which sequences run this step, and how many tokens each.

Each step has a token budget. Running sequences go first (a decode costs one
token, a prefill in progress takes a chunk of what is left), then waiting
sequences are admitted in arrival order while the budget, the sequence limit
and free pages allow. When a running sequence needs a page and none is free,
unreferenced prefix-cache pages are evicted first, then pinned ones that no
sequence holds (they spill to the host or disk tier, engine/kv/prefix_spill.py);
failing that, the most recently arrived running sequence is preempted: its
pages are freed and it goes back to the head of the queue to be recomputed
later. A waiting request makes pinned pages give way only when nothing is
running (else it would be failed); while others run it waits for their pages
instead, which keeps the resident prefix in place.

A new request first asks the spill tier (`restore`) to bring back pages of
its prompt's cached prefix that gave way earlier, then reuses what the cache
holds.

Page ownership: a sequence holds one reference on every page in its page
table, the prefix cache one on every page in its tree. The scheduler takes a
sequence's references (allocation, or retaining cached pages on a prefix hit)
and gives them back when the sequence finishes or is preempted. A hybrid
model's running sequence also holds one recurrent-state slot
(engine/kv/state_slots.py), taken at admission and given back with its pages.
With a prefix cache that keeps such a model's states, a prefix is reused only
up to a snapshot of the state, and chunks stop where one is worth keeping
(engine/core/snapshot_points.py): a chunk's snapshot entry is handed to the
tree with its pages after the step (`cache`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from engine.core.snapshot_points import SnapshotPoints
from engine.errors import EngineOverloadedError
from engine.kv.pages import PageAllocator
from engine.kv.radix import RadixCache
from engine.kv.state_slots import StateSlots
from engine.requests.sequence import ScheduledSequence, Sequence, SequenceStatus
from engine.speculative import Speculator


class Scheduler:
    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefix_cache: RadixCache | None = None,
        max_waiting: int | None = None,
        speculator: Speculator | None = None,
        restore: Callable[[list[int], str], int] | None = None,
        state_slots: StateSlots | None = None,
    ):
        self.allocator = allocator
        self.state_slots = state_slots
        self.restore = restore
        self.speculator = speculator
        self.prefix_cache = prefix_cache
        # A hybrid model's prefix reuse: where its prefills keep their states, else None.
        self.snapshot_points = None
        if prefix_cache is not None and prefix_cache.snapshots is not None:
            self.snapshot_points = SnapshotPoints(prefix_cache.snapshots, page_size)
        self.max_waiting = max_waiting
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.failed: list[Sequence] = []  # given up on during the last schedule()

    def add(self, seq: Sequence) -> None:
        if self.max_waiting is not None and len(self.waiting) >= self.max_waiting:
            raise EngineOverloadedError(
                f"{len(self.waiting)} requests are already waiting; retry shortly"
            )
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk(self, seq: Sequence, budget: int) -> int:
        num_tokens = min(seq.num_uncomputed, budget, seq.max_chunk or budget)
        if self.snapshot_points is not None:
            num_tokens = self.snapshot_points.cut(seq, num_tokens)
        return num_tokens

    def _scheduled(self, seq: Sequence, num_tokens: int, load: int | None = None):
        """This step's work for `seq`; for a hybrid model, with the snapshot it starts
        from (`load`, after a prefix hit) and the entry to keep its state in, if any."""
        item = ScheduledSequence(seq, num_tokens, load_snapshot=load)
        if self.snapshot_points is not None:
            item.save_snapshot = self.snapshot_points.save_entry(seq, num_tokens)
        return item

    def _pages_needed(self, seq: Sequence, num_tokens: int) -> int:
        total = seq.num_computed_tokens + num_tokens
        return max(0, -(-total // self.page_size) - len(seq.pages))

    def _grow(self, seq: Sequence, num_tokens: int, evict_pinned: bool = True) -> bool:
        needed = self._pages_needed(seq, num_tokens)
        shortfall = needed - self.allocator.num_free
        if shortfall > 0 and self.prefix_cache is not None:
            # Unpinned leaves go first; pinned ones only for what they cannot cover.
            self.prefix_cache.evict(shortfall, pinned=evict_pinned)
        if not self.allocator.can_allocate(needed):
            return False
        seq.pages.extend(self.allocator.allocate(needed))
        return True

    def free(self, seq: Sequence) -> None:
        self.allocator.release(seq.pages)
        seq.pages = []
        if seq.state_slot is not None:
            self.state_slots.release(seq.state_slot)
            seq.state_slot = None

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache(seq)  # its recompute may then find its own pages still cached
        self.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> list[ScheduledSequence]:
        self.failed = []
        if self.snapshot_points is not None:
            self.snapshot_points.new_schedule()
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        # Running sequences in arrival order; the newest are preempted first.
        queue = sorted(self.running, key=lambda s: s.arrival)
        while queue and budget > 0:
            seq = queue.pop(0)
            verify = self._speculate(seq, budget, others=len(queue))
            if verify is not None:
                scheduled.append(verify)
                budget -= verify.num_tokens
                continue
            num_tokens = self._chunk(seq, budget)
            while not self._grow(seq, num_tokens):
                victim = queue.pop() if queue else None
                if victim is None:
                    # Nothing else to evict: this sequence waits for pages itself.
                    self._preempt(seq)
                    break
                self._preempt(victim)
            else:
                scheduled.append(self._scheduled(seq, num_tokens))
                budget -= num_tokens
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            load = self._reuse_cached_prefix(seq)
            num_tokens = self._chunk(seq, budget)
            idle = not self.running and not scheduled
            if not self._grow(seq, num_tokens, evict_pinned=idle):
                self.free(seq)
                seq.num_computed_tokens = 0
                if idle:
                    # Nothing will ever free more pages: fail it rather than wait forever.
                    self.waiting.popleft()
                    self._fail_unschedulable(seq, num_tokens)
                    self.failed.append(seq)
                    continue
                break
            self.waiting.popleft()
            if self.state_slots is not None:  # never short: running <= max_num_seqs = slots
                seq.state_slot = self.state_slots.allocate()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            scheduled.append(self._scheduled(seq, num_tokens, load))
            budget -= num_tokens
        return scheduled

    def _speculate(self, seq: Sequence, budget: int, others: int) -> ScheduledSequence | None:
        """A verification step for a decoding sequence with a draft, if it fits.

        Drafts only use pages that are free now and leave one per running
        sequence still to be scheduled, so speculation never evicts cached
        prefixes or preempts anyone; otherwise the sequence decodes plainly.
        """
        if self.speculator is None or seq.num_uncomputed != 1 or budget < 2:
            return None
        limit = min(budget, seq.max_chunk or budget) - 1
        draft = self.speculator.draft(seq, limit=limit) if limit > 0 else []
        if not draft:
            return None
        needed = self._pages_needed(seq, 1 + len(draft))
        if needed > self.allocator.num_free - others:
            return None
        seq.pages.extend(self.allocator.allocate(needed))
        return ScheduledSequence(seq, 1 + len(draft), draft)

    def rollback(self, seq: Sequence) -> None:
        """Give back the pages past the verified tokens (num_computed_tokens, already
        set). They were allocated for this step's draft, so the sequence is their only
        holder and the prefix cache never saw them: they go straight back to the pool.
        Slots of rejected tokens in a kept page are simply overwritten later."""
        keep = -(-seq.num_computed_tokens // self.page_size)
        if len(seq.pages) > keep:
            self.allocator.release(seq.pages[keep:])
            del seq.pages[keep:]

    def _fail_unschedulable(self, seq: Sequence, num_tokens: int) -> None:
        # Nothing runs and every cached page that could give way has: the request
        # alone needs more pages than the pool has to give.
        needed = -(-num_tokens // self.page_size)
        seq.error = (
            f"the request needs {needed} KV pages but only {self.allocator.num_free} of "
            f"{self.allocator.num_pages} can be freed; raise --kv-memory or shorten the prompt"
        )
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "error"

    def _reuse_cached_prefix(self, seq: Sequence) -> int | None:
        """Start a fresh sequence after the longest prefix the cache holds for its salt;
        for a hybrid model, returns the snapshot of the state there (None: no hit)."""
        if self.prefix_cache is None or seq.pages or seq.num_computed_tokens:
            return None
        if seq.params.prompt_logprobs is not None or seq.collect_logits:
            return None  # cached positions have no logits to report
        if self.restore is not None:
            self.restore(seq.token_ids, seq.cache_salt)  # spilled pages come back first
        match = self.prefix_cache.match(seq.token_ids, seq.cache_salt)
        for page in match.pages:
            self.allocator.retain(page)
        seq.pages = list(match.pages)
        seq.num_computed_tokens = match.num_pages * self.page_size
        seq.num_cached_tokens = max(seq.num_cached_tokens, seq.num_computed_tokens)
        if self.snapshot_points is None:
            return None
        return self.snapshot_points.reused(seq, match)

    def cache(self, seq: Sequence, snapshot: int | None = None) -> None:
        """Offer the sequence's computed full pages to the prefix cache, and `snapshot`
        (hybrid models: the state kept after this step, which ended on a page boundary)."""
        if self.prefix_cache is not None and seq.pages:
            computed = seq.token_ids[: seq.num_computed_tokens]
            self.prefix_cache.insert(computed, seq.pages, seq.cache_salt, snapshot)
        elif snapshot is not None and self.prefix_cache is not None:
            self.prefix_cache.snapshots.give_back(snapshot)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if reason != "abort":
            self.cache(seq)
        self.free(seq)
        if self.speculator is not None:
            self.speculator.release(seq)
