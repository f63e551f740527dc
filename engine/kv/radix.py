"""Prefix cache: a radix tree over full KV pages, shared within one cache salt.

Each node below a salt's root stands for one full page of tokens and holds one
reference on that page (PageAllocator refcounts), so a page the tree knows is
never freed under it. Sequences that reuse a cached prefix take their own
reference on its pages and only ever write new tokens to pages they allocated
themselves: shared pages are read-only.

Eviction frees least-recently-used leaves that no sequence holds and that are
not pinned. Pinning (the agent pins its repository snapshot) protects a path.
A verification mode hashes a page's bytes when it enters the tree and checks
them every time the page is reused, to catch anything that writes to a
shared page.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.kv.pages import PageAllocator


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


@dataclass
class PrefixMatch:
    pages: list[int]
    nodes: list[RadixNode]

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
    ):
        self.allocator = allocator
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.verify = verify and page_bytes is not None
        self.roots: dict[str, RadixNode] = {}
        self._clock = itertools.count(1)
        self.num_pages = 0
        self.hit_tokens = 0
        self.query_tokens = 0

    def _root(self, salt: str) -> RadixNode:
        if salt not in self.roots:
            self.roots[salt] = RadixNode(tokens=(), page=-1, parent=None)
        return self.roots[salt]

    def _chunks(self, tokens: list[int], max_pages: int):
        for i in range(max_pages):
            yield tuple(tokens[i * self.page_size : (i + 1) * self.page_size])

    def match(self, tokens: list[int], salt: str = "", record: bool = True) -> PrefixMatch:
        """The longest cached run of full pages that prefixes `tokens`, leaving one token
        uncached so the request still computes logits for its last prompt token."""
        usable = (len(tokens) - 1) // self.page_size
        node = self.roots.get(salt)
        pages: list[int] = []
        nodes: list[RadixNode] = []
        if node is not None:
            now = next(self._clock)
            for chunk in self._chunks(tokens, usable):
                child = node.children.get(chunk)
                if child is None:
                    break
                if self.verify and child.digest != self._digest(child.page):
                    raise SharedPageCorrupted(
                        f"page {child.page} changed after it was shared in the prefix cache"
                    )
                child.last_used = now
                pages.append(child.page)
                nodes.append(child)
                node = child
        if record:
            self.query_tokens += len(tokens)
            self.hit_tokens += len(pages) * self.page_size
        return PrefixMatch(pages, nodes)

    def insert(self, tokens: list[int], pages: list[int], salt: str = "") -> list[RadixNode]:
        """Offer a sequence's full pages ([len(tokens) // page_size] of them) to the tree.

        Pages whose tokens the tree already has are left to the sequence; new
        ones gain the tree's reference. Returns the nodes on the path.
        """
        full = min(len(tokens) // self.page_size, len(pages))
        node = self._root(salt)
        now = next(self._clock)
        path = []
        for i, chunk in enumerate(self._chunks(tokens, full)):
            child = node.children.get(chunk)
            if child is None:
                child = RadixNode(tokens=chunk, page=pages[i], parent=node)
                if self.verify:
                    child.digest = self._digest(pages[i])
                node.children[chunk] = child
                self.allocator.retain(pages[i])
                self.num_pages += 1
            child.last_used = now
            path.append(child)
            node = child
        return path

    def pin(self, nodes: list[RadixNode]) -> None:
        for node in nodes:
            node.pins += 1

    def unpin(self, nodes: list[RadixNode]) -> None:
        for node in nodes:
            node.pins = max(0, node.pins - 1)

    def _evictable_leaves(self) -> list[RadixNode]:
        leaves = []
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if (
                node.parent is not None
                and not node.children
                and node.pins == 0
                and self.allocator.refcount(node.page) == 1
            ):
                leaves.append(node)
        return leaves

    def evict(self, num_pages: int) -> int:
        """Free up to `num_pages` pages, least recently used leaves first."""
        freed = 0
        while freed < num_pages:
            leaves = self._evictable_leaves()
            if not leaves:
                break
            leaves.sort(key=lambda n: n.last_used)
            for leaf in leaves:
                if freed >= num_pages:
                    break
                self._remove(leaf)
                freed += 1
        return freed

    def _remove(self, node: RadixNode) -> None:
        assert node.parent is not None
        del node.parent.children[node.tokens]
        self.allocator.release([node.page])
        self.num_pages -= 1

    def clear(self) -> None:
        """Drop every unpinned page no sequence holds (e.g. after changing KV scales)."""
        while self.evict(self.num_pages or 1):
            pass

    def _digest(self, page: int) -> bytes:
        assert self.page_bytes is not None
        return hashlib.blake2b(self.page_bytes(page), digest_size=16).digest()

    def _nodes(self):
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.parent is not None:
                yield node

    def paths(self) -> list[tuple[str, list[int], int, bool]]:
        """(salt, tokens, last use, pinned) of every root-to-leaf path, most recently
        used first (what the disk tier saves when a server stops)."""
        out = []
        for salt, root in self.roots.items():
            stack = [(root, [])]
            while stack:
                node, tokens = stack.pop()
                for child in node.children.values():
                    stack.append((child, tokens + list(child.tokens)))
                if node is not root and not node.children:
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
