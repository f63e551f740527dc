"""Recurrent-state snapshots held by the prefix cache, so a hybrid model's cached prefix can be reused.

A hybrid model (Kimi Linear) computes each token from the KV of its attention
layers *and* from the recurrent state its linear-attention layers carried up
to it. Cached pages give the first; without the state at the prefix's end the
prefix would have to be computed again from its first token. So the engine
keeps a fixed number of snapshot entries (a second RecurrentStatePool,
engine/kv/state_pool.py, sized from the KV budget by engine/kv/state_budget.py),
and a radix node (engine/kv/radix.py) that holds one (`node.snapshot`) carries
the state after the last token of its page. A request reuses a cached prefix
only up to the deepest such node.

This file hands the entries out and back, integers only, as the page
allocator does pages:

- `take` gives a free entry, else drops the least valuable snapshot a node
  holds: unpinned before pinned, least recently used first, and among equals
  the shallowest (a prefix's end saves more prefill than a chunk boundary
  inside it). The node keeps its page: only reuse past its last snapshot is lost;
- an entry a request matched is locked until the next schedule, so nothing
  taken meanwhile (a tier's restore) overwrites it before the step copies it
  into the request's state slot;
- a node gives its snapshot back when its page leaves the tree (`detach`).
"""

from __future__ import annotations

from typing import Protocol


class RadixNode(Protocol):
    """What this file reads and sets of a tree node (engine/kv/radix.py's RadixNode,
    which imports this file)."""

    snapshot: int | None
    parent: RadixNode | None
    pins: int
    last_used: int


class PrefixSnapshots:
    def __init__(self, num_entries: int):
        self.num_entries = num_entries
        self._free = list(range(num_entries - 1, -1, -1))  # pop() hands out entry 0 first
        self._held: dict[int, tuple[RadixNode, int]] = {}  # entry -> (node, its depth)
        self._locked: set[int] = set()
        self.dropped = 0  # snapshots given up to make room for newer ones

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self) -> int | None:
        """A free entry, making room if needed; None when every held one is locked."""
        if not self._free and not self._drop_least_valuable():
            return None
        return self._free.pop()

    def give_back(self, entry: int) -> None:
        """An entry taken but never attached (its step was not kept)."""
        self._free.append(entry)

    def attach(self, node: RadixNode, entry: int) -> bool:
        """`node` keeps `entry` as the state at its page's end; False, and the entry goes
        back, when it already has one (another request got there first)."""
        if node.snapshot is not None:
            self.give_back(entry)
            return False
        depth, up = 0, node
        while up.parent is not None:
            depth, up = depth + 1, up.parent
        node.snapshot = entry
        self._held[entry] = (node, depth)
        return True

    def detach(self, node: RadixNode) -> None:
        """The node's page leaves the tree (or gives way): its snapshot goes with it."""
        entry = node.snapshot
        if entry is not None:
            node.snapshot = None
            del self._held[entry]
            self._free.append(entry)

    @staticmethod
    def reusable(nodes: list[RadixNode]) -> int:
        """How many of a match's leading nodes a request can reuse: up to the deepest
        one with a snapshot (past it, pages without the state there are useless)."""
        return next(
            (i + 1 for i in reversed(range(len(nodes))) if nodes[i].snapshot is not None), 0
        )

    def lock(self, entry: int) -> None:
        self._locked.add(entry)

    def unlock_all(self) -> None:
        """A new schedule: the last step has copied what it matched."""
        self._locked.clear()

    def _drop_least_valuable(self) -> bool:
        ranked = [
            (node.pins > 0, node.last_used, depth, entry)
            for entry, (node, depth) in self._held.items()
            if entry not in self._locked
        ]
        if not ranked:
            return False
        self.detach(self._held[min(ranked)[-1]][0])
        self.dropped += 1
        return True
