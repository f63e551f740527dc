"""Where a hybrid model's prefills keep their recurrent state for the prefix cache.

A cached prefix of a model with recurrent state (Kimi Linear) is reusable only
up to a page boundary whose state the cache keeps (engine/kv/prefix_snapshots.py).
A state exists only at the end of a step, so the scheduler decides, chunk by
chunk, where steps end and which ends are kept:

- kept: the end of a prefill chunk that falls on a page boundary, up to the
  last page boundary a repeat of the same prompt could reuse
  (`(len - 1) // page * page`: RadixCache.match leaves the last token to compute);
- cut: a chunk that would run past that boundary stops there, so every prompt
  leaves its state at its last whole page; so does one that would run past
  `seq.state_cut`, the end of the pages the tree holds for this prompt beyond the
  snapshot it reused (pages another prompt left without a state there: the
  repository two conversations share, say, is then reused whole from the next
  request on, instead of from the last chunk boundary inside it);
- loaded: a request that reuses a cached prefix starts from that prefix's
  snapshot, locked until its step has copied it into the request's slot.

Decode steps keep nothing: they end past the prompt's last page. Models
without recurrent state have no SnapshotPoints, and their chunks are untouched.
Each cut costs one more step for the few tokens after it.
"""

from __future__ import annotations

from engine.kv.prefix_snapshots import PrefixSnapshots
from engine.kv.radix import PrefixMatch
from engine.requests.sequence import Sequence


class SnapshotPoints:
    def __init__(self, snapshots: PrefixSnapshots, page_size: int):
        self.snapshots = snapshots
        self.page_size = page_size

    def new_schedule(self) -> None:
        """The last step ran: the snapshots it loaded may be dropped again."""
        self.snapshots.unlock_all()

    def reused(self, seq: Sequence, match: PrefixMatch) -> int | None:
        """After a prefix-cache lookup: where this prompt's prefill should stop to keep a
        state (`seq.state_cut`), and the snapshot it starts from (locked), if any."""
        past = match.cached_pages > match.num_pages
        seq.state_cut = match.cached_pages * self.page_size if past else 0
        if match.num_pages and match.snapshot is None:
            raise RuntimeError("a cached prefix of a model with recurrent state has no state")
        if match.snapshot is not None:
            self.snapshots.lock(match.snapshot)
        return match.snapshot

    def _last_page(self, seq: Sequence) -> int:
        return (seq.num_tokens - 1) // self.page_size * self.page_size

    def cut(self, seq: Sequence, num_tokens: int) -> int:
        """`num_tokens`, or fewer so the chunk ends at the next point worth keeping."""
        start = seq.num_computed_tokens
        for point in sorted((seq.state_cut, self._last_page(seq))):
            if start < point < start + num_tokens:
                return point - start
        return num_tokens

    def save_entry(self, seq: Sequence, num_tokens: int) -> int | None:
        """A snapshot entry to keep the state in after this chunk, when it ends on a page
        boundary of the prompt worth keeping (and an entry can be had)."""
        end = seq.num_computed_tokens + num_tokens
        if end % self.page_size or end > self._last_page(seq):
            return None
        return self.snapshots.take()
