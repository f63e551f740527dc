"""Prefix cache: a radix tree over full KV pages, shared within one cache salt.

Each node below a salt's root stands for one full page of tokens and holds one
reference on that page (PageAllocator refcounts), so a page the tree knows is
never freed under it. Sequences that reuse a cached prefix take their own
reference on its pages and only ever write new tokens to pages they allocated
themselves: shared pages are read-only.

Eviction frees least-recently-used leaves that no sequence holds, unpinned
ones first. Pinning (the agent pins its repository snapshot) protects a path
from ordinary eviction; only when that cannot free enough do pinned leaves
give way (`evict(..., pinned=True)`, the scheduler's last resort before
preempting or failing a request). A pinned node that gives way stays in the
tree as a *spilled* node: same tokens, same pins, no page. So a pin handle
stays valid (unpin works and keeps the counts exact), `match` stops in front
of it (its tokens are not cached), and the next `insert` of those tokens (a
restore from the spill tier, engine/kv/prefix_spill.py, or a plain prefill)
gives it a page again, still pinned. Before its page goes back to the pool,
the `spill` hook sees it, so its bytes can be copied out. Spilled nodes
nobody pins any more are forgotten. Invariant: a resident node's ancestors
are resident (eviction takes the tail first, insert fills from the head).

A verification mode hashes a page's bytes when it enters the tree and checks
them every time the page is reused, to catch anything that writes to a
shared page.

A hybrid model's tree (`snapshots`, engine/kv/prefix_snapshots.py) also keeps
recurrent-state snapshots on some nodes: the state after that page's last
token. A request's match then stops at the deepest node with one (pages past
it are useless without the state there), leaf pages without one are evicted
before those with one, and a node's snapshot leaves with its page.

With KV events on (`events`, engine/kv/kv_events.py), each node carries vLLM's
block hash of its page (its tokens, every page before it and the cache salt),
and the tree reports what it holds as vLLM's block pool does: pages that gain
a place (a prefill, a restore) as BlockStored, one event per run of new pages
on a path; pages that leave (evicted, or pinned ones giving way) as
BlockRemoved; a `clear` that leaves nothing behind as AllBlocksCleared (one
that leaves pages sequences still hold reports what went, page by page).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.kv.kv_event_recorder import KVEventSink
from engine.kv.kv_events import MEDIUM_GPU
from engine.kv.pages import PageAllocator
from engine.kv.prefix_snapshots import PrefixSnapshots

SPILLED = -1  # the page of a node whose page gave way under pressure


class SharedPageCorrupted(RuntimeError):
    """A cached page's contents changed after it was shared (verification mode)."""


@dataclass
class RadixNode:
    tokens: tuple[int, ...]
    page: int
    parent: RadixNode | None
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    last_used: int = 0
    pins: int = 0
    digest: bytes | None = None
    salt: str = ""  # roots only: the cache salt below them
    block_hash: bytes | None = None  # vLLM's hash of this page (KV events on)
    snapshot: int | None = None  # hybrid models: the recurrent state at this page's end

    @property
    def resident(self) -> bool:
        return self.page != SPILLED

    def event_block(self) -> tuple[bytes, bytes | None, tuple[int, ...]] | None:
        """(block hash, parent's block hash, tokens) for KV events; None when they are off."""
        if self.block_hash is None or self.parent is None:
            return None
        return self.block_hash, self.parent.block_hash, self.tokens


@dataclass
class PrefixMatch:
    pages: list[int]
    nodes: list[RadixNode]
    spilled: bool = False  # the walk stopped at a spilled page of this prompt
    # Hybrid models, a request's match: the snapshot to start from (at the last page),
    # and how many pages of the prompt the tree holds, the unusable ones past it too.
    snapshot: int | None = None
    cached_pages: int = 0

    @property
    def num_pages(self) -> int:
        return len(self.pages)


class RadixCache:
    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int,
        page_bytes: Callable[[int], bytes] | None = None,
        verify: bool = False,
        events: KVEventSink | None = None,
        snapshots: PrefixSnapshots | None = None,
    ):
        self.allocator = allocator
        self.snapshots = snapshots  # a hybrid model's recurrent-state snapshots, else None
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.verify = verify and page_bytes is not None
        self.roots: dict[str, RadixNode] = {}
        self._clock = itertools.count(1)
        self.num_pages = 0
        # Called with [(node, page)] of pinned nodes giving way, before those pages
        # return to the pool (engine/kv/prefix_spill.py copies them out).
        self.spill: Callable[[list[tuple[RadixNode, int]]], None] | None = None
        self.hit_tokens = 0
        self.query_tokens = 0
        self.events = events  # where stored/removed/cleared pages are reported, or None
        self._clearing: list[bytes] | None = None  # removals a running clear() gathers

    def _root(self, salt: str) -> RadixNode:
        if salt not in self.roots:
            self.roots[salt] = RadixNode(tokens=(), page=SPILLED, parent=None, salt=salt)
        return self.roots[salt]

    def _chunks(self, tokens: list[int], max_pages: int):
        for i in range(max_pages):
            yield tuple(tokens[i * self.page_size : (i + 1) * self.page_size])

    def match(self, tokens: list[int], salt: str = "", record: bool = True) -> PrefixMatch:
        """The longest cached run of full pages that prefixes `tokens`, leaving one token
        uncached so the request still computes logits for its last prompt token.

        `record`: a request's lookup, counted for the hit rate; in a tree with
        snapshots it stops at the deepest page that has one (`snapshot`)."""
        usable = (len(tokens) - 1) // self.page_size
        node = self.roots.get(salt)
        pages: list[int] = []
        nodes: list[RadixNode] = []
        spilled = False
        if node is not None:
            now = next(self._clock)
            for chunk in self._chunks(tokens, usable):
                child = node.children.get(chunk)
                if child is None or not child.resident:
                    spilled = child is not None
                    break
                if self.verify and child.digest != self._digest(child.page):
                    raise SharedPageCorrupted(
                        f"page {child.page} changed after it was shared in the prefix cache"
                    )
                child.last_used = now
                pages.append(child.page)
                nodes.append(child)
                node = child
        cached, snapshot = len(pages), None
        if record and self.snapshots is not None:
            keep = self.snapshots.reusable(nodes)
            pages, nodes = pages[:keep], nodes[:keep]
            snapshot = nodes[-1].snapshot if nodes else None
        if record:
            self.query_tokens += len(tokens)
            self.hit_tokens += len(pages) * self.page_size
        return PrefixMatch(pages, nodes, spilled, snapshot, cached)

    def insert(
        self, tokens: list[int], pages: list[int], salt: str = "", snapshot: int | None = None
    ) -> list[RadixNode]:
        """Offer a sequence's full pages ([len(tokens) // page_size] of them) to the tree.

        Pages whose tokens the tree already has are left to the sequence; new
        ones gain the tree's reference. `snapshot` (hybrid models): the state
        after `tokens`, which end on a page boundary, kept by the last node.
        Returns the nodes on the path.
        """
        full = min(len(tokens) // self.page_size, len(pages))
        node = self._root(salt)
        now = next(self._clock)
        path: list[RadixNode] = []
        run: list[RadixNode] = []  # pages that just gained a place, in a row (KV events)
        for i, chunk in enumerate(self._chunks(tokens, full)):
            child = node.children.get(chunk)
            fresh = child is None or not child.resident
            if child is None:
                child = RadixNode(tokens=chunk, page=pages[i], parent=node)
                if self.verify:
                    child.digest = self._digest(pages[i])
                node.children[chunk] = child
                self.allocator.retain(pages[i])
                self.num_pages += 1
            elif not child.resident:  # computed or restored again: it holds a page anew
                child.page = pages[i]
                if self.verify:
                    child.digest = self._digest(pages[i])
                self.allocator.retain(pages[i])
                self.num_pages += 1
            child.last_used = now
            if self.events is not None:
                if child.block_hash is None:
                    child.block_hash = self.events.hash_block(node.block_hash, chunk, salt)
                if fresh:
                    run.append(child)
                elif run:
                    self._report_stored(run)
                    run = []
            path.append(child)
            node = child
        if run:
            self._report_stored(run)
        if snapshot is not None:
            assert self.snapshots is not None
            if path and len(path) * self.page_size == len(tokens):
                self.snapshots.attach(path[-1], snapshot)
            else:  # the state is not at the end of a page this tree holds
                self.snapshots.give_back(snapshot)
        return path

    def _report_stored(self, run: list[RadixNode]) -> None:
        """One BlockStored for a chain of pages new to the tree (parent: the page before)."""
        assert self.events is not None and run[0].parent is not None
        tokens = [t for node in run for t in node.tokens]
        hashes = [node.block_hash for node in run]
        self.events.stored(hashes, run[0].parent.block_hash, tokens, MEDIUM_GPU)

    def pin(self, nodes: list[RadixNode]) -> None:
        for node in nodes:
            node.pins += 1

    def unpin(self, nodes: list[RadixNode]) -> None:
        for node in nodes:
            node.pins = max(0, node.pins - 1)
        for node in reversed(nodes):  # deepest first: a spilled tail goes before its head
            self._forget_spilled(node)

    def _forget_spilled(self, node: RadixNode) -> None:
        """Drop spilled nodes that nobody pins and nothing hangs below: they hold no
        page, and an unpinned page's tokens are simply not cached."""
        while (
            node.parent is not None
            and not node.resident
            and not node.pins
            and not node.children
            and node.parent.children.get(node.tokens) is node
        ):
            del node.parent.children[node.tokens]
            node = node.parent

    def _evictable(self, node: RadixNode, pinned: bool) -> bool:
        """A resident leaf (nothing resident below) that only the tree holds."""
        return (
            node.parent is not None
            and node.resident
            and (pinned or node.pins == 0)
            and self.allocator.refcount(node.page) == 1
            and not any(child.resident for child in node.children.values())
        )

    def evict(self, num_pages: int, pinned: bool = False) -> int:
        """Free up to `num_pages` pages, least recently used leaves first.

        With `pinned`, pinned leaves no sequence holds may go too, after every
        unpinned one: they become spilled nodes (the `spill` hook sees them
        first). A parent whose last resident child went joins the candidates,
        so a path is eaten from its tail."""
        tie = itertools.count()
        states = self.snapshots is not None

        def rank(node: RadixNode):
            # With snapshots, a leaf without one ends no usable prefix: it goes first.
            return (
                node.pins > 0,
                states and node.snapshot is not None,
                node.last_used,
                next(tie),
                node,
            )

        heap = [rank(n) for n in self._nodes() if self._evictable(n, pinned)]
        heapq.heapify(heap)
        freed, spilled, gone = 0, [], []
        while heap and freed < num_pages:
            node = heapq.heappop(heap)[-1]
            parent = node.parent
            gone.append(node.block_hash)
            if node.pins:
                spilled.append((node, node.page))  # the hook copies its snapshot too
                node.page, node.digest = SPILLED, None
                self.num_pages -= 1
            else:
                self._remove(node)
            freed += 1
            if self._evictable(parent, pinned):
                heapq.heappush(heap, rank(parent))
        if self.events is not None and gone:
            if self._clearing is not None:
                self._clearing.extend(gone)
            else:
                self.events.removed(gone, MEDIUM_GPU)
        if spilled:
            try:
                if self.spill is not None:
                    self.spill(spilled)  # before the pages can be handed out again
            finally:  # whatever the hook did, the tree no longer holds these pages
                self.allocator.release([page for _, page in spilled])
                if self.snapshots is not None:
                    for node, _ in spilled:
                        self.snapshots.detach(node)
        return freed

    def _remove(self, node: RadixNode) -> None:
        assert node.parent is not None
        del node.parent.children[node.tokens]
        self.allocator.release([node.page])
        self.num_pages -= 1
        if self.snapshots is not None:
            self.snapshots.detach(node)

    def clear(self, pinned: bool = False) -> None:
        """Drop every unpinned page no sequence holds; with `pinned`, the pinned ones
        too, as spilled nodes that keep their pins but are not copied out: after the
        KV scales change (calibration) their bytes mean nothing, so they are
        prefilled again."""
        hook = self.spill
        if pinned:
            self.spill = None
        self._clearing = []
        try:
            while self.evict(self.num_pages or 1, pinned=pinned):
                pass
        finally:
            self.spill = hook
            gone, self._clearing = self._clearing, None
            if self.events is not None:
                if self.num_pages == 0:
                    self.events.cleared()  # nothing resident: as vLLM's reset_prefix_cache
                else:
                    self.events.removed(gone, MEDIUM_GPU)

    def _digest(self, page: int) -> bytes:
        assert self.page_bytes is not None
        return hashlib.blake2b(self.page_bytes(page), digest_size=16).digest()

    def _nodes(self):
        """Every resident node (spilled ones hold no page; none is resident below them)."""
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            stack.extend(child for child in node.children.values() if child.resident)
            if node.parent is not None:
                yield node

    def spilled_pages(self) -> int:
        """Pinned pages that gave way and are not back yet (nodes without a page)."""
        count, stack = 0, list(self.roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            count += node.parent is not None and not node.resident
        return count

    def paths(self) -> list[tuple[str, list[int], int, bool]]:
        """(salt, tokens, last use, pinned) of every root-to-leaf path, most recently
        used first (what the disk tier saves when a server stops)."""
        out = []
        for salt, root in self.roots.items():
            stack = [(root, [])]
            while stack:
                node, tokens = stack.pop()
                resident = [child for child in node.children.values() if child.resident]
                for child in resident:
                    stack.append((child, tokens + list(child.tokens)))
                if node is not root and not resident:
                    pinned = any(n.pins for n in self._ancestors(node))
                    out.append((salt, tokens, node.last_used, pinned))
        return sorted(out, key=lambda p: (not p[3], -p[2]))

    @staticmethod
    def _ancestors(node: RadixNode):
        while node.parent is not None:
            yield node
            node = node.parent

    def pages_held_only_by_cache(self) -> int:
        return sum(1 for node in self._nodes() if self.allocator.refcount(node.page) == 1)

    @property
    def cached_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0
