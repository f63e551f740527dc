"""The host-memory tier of the prefix cache: spilled KV pages, bounded, LRU out.

When pinned prefix pages give way under pool pressure (engine/kv/radix.py),
their bytes land here, so the next turn on that prefix copies them back
instead of prefilling. Entries are keyed exactly as the disk tier's page
files (engine/kv/disk_tier.py): a hash chain over the page tokens rooted in
the engine fingerprint, the KV scales in force and the cache salt, so a
different model, dtype, scale set, salt or any earlier token never matches.
Each entry also keeps its parent key, depth and tokens (checked on the way
back, as the disk tier checks its files) and a blake2b of its payload: a
mismatch drops the entry and the caller prefills from there.

Payloads are plain `bytes` (the pool's storage bytes for the page across all
layers), whatever device the pool is on: on a GPU they are the host copy,
and a CPU test can turn the tier on just the same. A hybrid model's page may
also carry `state`, the recurrent-state snapshot its node kept
(engine/kv/prefix_snapshots.py), checked with the payload. The budget counts
payload and state bytes; the few hundred bytes of bookkeeping per entry are
left out.

Order: least recently put or touched first out. A spilled run is put tail
first, so, as on disk, a prefix loses its tail before its head. What the
budget pushes out is returned to the caller, which may write it to the disk
tier (host memory first, then disk).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

DIGEST = 16


def payload_digest(payload: bytes, state: bytes = b"") -> bytes:
    digest = hashlib.blake2b(payload, digest_size=DIGEST)
    digest.update(state)
    return digest.digest()


@dataclass
class HostEntry:
    key: bytes
    parent: bytes
    depth: int
    tokens: tuple[int, ...]
    salt: str
    payload: bytes
    digest: bytes
    state: bytes = b""  # a hybrid model's recurrent state at the page's end, if kept

    @classmethod
    def of(cls, key, parent, depth, tokens, salt, payload, state=b"") -> HostEntry:
        digest = payload_digest(payload, state)
        return cls(key, parent, depth, tuple(tokens), salt, payload, digest, state)

    @property
    def size(self) -> int:
        return len(self.payload) + len(self.state)


class HostTier:
    def __init__(self, budget_bytes: int):
        self.budget_bytes = int(budget_bytes)
        self._entries: OrderedDict[bytes, HostEntry] = OrderedDict()
        self.bytes = 0
        self.dropped_damaged = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def put(self, entries: list[HostEntry]) -> list[HostEntry]:
        """Keep these entries (most recent last); returns what no longer fits, oldest
        first, which may include an entry just given if it alone exceeds the budget."""
        for entry in entries:
            old = self._entries.pop(entry.key, None)
            if old is not None:
                self.bytes -= old.size
            self._entries[entry.key] = entry
            self.bytes += entry.size
        out = []
        while self.bytes > self.budget_bytes and self._entries:
            _, entry = self._entries.popitem(last=False)
            self.bytes -= entry.size
            out.append(entry)
        return out

    def take(self, key: bytes, parent: bytes, depth: int, tokens: list[int]) -> HostEntry | None:
        """The entry stored under `key`, removed from the tier (its page goes back to the
        pool); None when there is none or it fails a check (then it is dropped)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self.bytes -= entry.size
        place = (entry.parent, entry.depth, entry.tokens)
        damaged = payload_digest(entry.payload, entry.state) != entry.digest
        if place != (parent, depth, tuple(tokens)) or damaged:
            self.dropped_damaged += 1
            return None
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
