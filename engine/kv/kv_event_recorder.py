"""What the prefix cache and its tiers report KV events to (engine/kv/kv_events.py).

The radix tree (engine/kv/radix.py) and the tiers beside it (prefix_spill.py's
host memory, prefix_store.py's disk) are handed a KVEventSink, the narrow
handle they need: hash a block as vLLM does, report blocks stored and removed,
and a clear. KVEventRecorder is that sink: it turns reports into vLLM's event
structs and keeps them, under a lock and bounded, until the publisher's thread
(engine/kv/kv_event_publisher.py) takes them. TierEvents remembers, for a tier
that keys its pages its own way, which block hash each page was reported under.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.kv.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHasher,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
    external_hash,
)


class KVEventSink(Protocol):
    """The narrow handle the radix tree and the tiers get: hash blocks, report them."""

    def hash_block(self, parent: bytes | None, tokens: Sequence[int], salt: str) -> bytes: ...
    def stored(
        self, hashes: list[bytes], parent: bytes | None, tokens: list[int], medium: str
    ) -> None: ...
    def removed(self, hashes: list[bytes], medium: str) -> None: ...
    def cleared(self) -> None: ...


@dataclass
class KVEventRecorder:
    """Events as the engine thread reports them, waiting for the publisher's thread.

    Reporting only appends under a lock: it never waits on the network. When more
    than `max_pending` events wait, they are all dropped and `take` says so (the
    publisher then skips a sequence number, so subscribers see the loss)."""

    block_size: int
    seed: str = "0"
    int_block_hashes: bool = True
    max_pending: int = 100_000
    dropped: int = 0
    _pending: list = field(default_factory=list)
    _lost: bool = False
    _ready: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.hasher = BlockHasher(self.seed)

    def hash_block(self, parent: bytes | None, tokens: Sequence[int], salt: str) -> bytes:
        return self.hasher.block(parent, tokens, salt)

    def _add(self, event: KVCacheEvent) -> None:
        with self._ready:
            if len(self._pending) >= self.max_pending:
                self.dropped += len(self._pending) + 1
                self._pending.clear()
                self._lost = True
            else:
                self._pending.append(event)
            self._ready.notify()

    def _wire(self, block_hash: bytes | None) -> ExternalBlockHash | None:
        return None if block_hash is None else external_hash(block_hash, self.int_block_hashes)

    def stored(
        self, hashes: list[bytes], parent: bytes | None, tokens: list[int], medium: str = MEDIUM_GPU
    ) -> None:
        if hashes:
            self._add(
                BlockStored(
                    block_hashes=[self._wire(h) for h in hashes],
                    parent_block_hash=self._wire(parent),
                    token_ids=list(tokens),
                    block_size=self.block_size,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                )
            )

    def removed(self, hashes: list[bytes], medium: str = MEDIUM_GPU) -> None:
        if hashes:
            self._add(BlockRemoved(block_hashes=[self._wire(h) for h in hashes], medium=medium))

    def cleared(self) -> None:
        self._add(AllBlocksCleared())

    def take(self, timeout: float | None = None) -> tuple[list[KVCacheEvent], bool]:
        """The waiting events (waiting up to `timeout` for one) and whether some were
        lost since the last take."""
        with self._ready:
            if not self._pending and not self._lost and timeout:
                self._ready.wait(timeout)
            events, lost = self._pending, self._lost
            self._pending, self._lost = [], False
        return events, lost

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()


class TierEvents:
    """The KV events of one tier beside the tree (host memory, disk), which keys its
    pages its own way: what it reported stored, by its key, so that the page's
    removal can be reported under the same block hash."""

    def __init__(self, sink: KVEventSink, medium: str):
        self.sink = sink
        self.medium = medium
        self.blocks: dict[Any, tuple[bytes, bytes | None, tuple[int, ...]]] = {}

    def stored(self, key: Any, block: tuple[bytes, bytes | None, tuple[int, ...]]) -> None:
        """Report the page `key` holds: (its block hash, its parent's, its tokens). Again
        is harmless (a consumer's claim is idempotent) and right after a tier was emptied
        behind these reports' back (a flush)."""
        self.blocks[key] = block
        self.sink.stored([block[0]], block[1], list(block[2]), self.medium)

    def removed(self, keys: list[Any]) -> None:
        gone = [self.blocks.pop(key)[0] for key in keys if key in self.blocks]
        self.sink.removed(gone, self.medium)

    def missing(self, present) -> None:
        """Report the removal of every reported page `present(key)` no longer finds."""
        self.removed([key for key in list(self.blocks) if not present(key)])
