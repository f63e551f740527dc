"""Page allocation with reference counts.

Ownership: a sequence holds one reference on each page in its page table.
The prefix cache (serving) may hold another on pages it shares; a page goes
back to the free list only when its last holder lets go. New tokens are only
ever written to pages whose sole holder is the writing sequence.
"""

from __future__ import annotations

from collections import deque

from engine.errors import KVCapacityError


class PageAllocator:
    def __init__(self, num_pages: int):
        if num_pages <= 0:
            raise KVCapacityError("the KV pool has no pages; raise --kv-memory")
        self.num_pages = num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._refcount = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise KVCapacityError(f"asked for {n} KV pages, {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(n)]
        for page in pages:
            self._refcount[page] = 1
        return pages

    def retain(self, page: int) -> None:
        if self._refcount[page] <= 0:
            raise RuntimeError(f"page {page} is free; it cannot gain a holder")
        self._refcount[page] += 1

    def release(self, pages: list[int]) -> None:
        for page in pages:
            count = self._refcount[page] - 1
            if count < 0:
                raise RuntimeError(f"page {page} released more often than held")
            self._refcount[page] = count
            if count == 0:
                self._free.append(page)

    def refcount(self, page: int) -> int:
        return self._refcount[page]
