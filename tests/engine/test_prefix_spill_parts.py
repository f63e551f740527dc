"""The parts of spilling on their own: pinned eviction in the radix tree, the host tier's
budget and checks, and batched page bytes in the pools."""

from __future__ import annotations

import pytest
import torch

from engine.kv.host_tier import HostEntry, HostTier
from engine.kv.mla_pool import MLALayout
from engine.kv.pages import PageAllocator
from engine.kv.pools import make_pool
from engine.kv.radix import RadixCache
from engine.kv.sizing import KVLayout


def cached(alloc: PageAllocator, cache: RadixCache, tokens: list[int]) -> list[int]:
    """Insert `tokens` as a finished sequence would: only the tree holds the pages."""
    pages = alloc.allocate(len(tokens) // cache.page_size)
    cache.insert(tokens, pages)
    alloc.release(pages)
    return pages


def test_pins_give_way_last_least_recently_used_first_tail_first():
    alloc = PageAllocator(6)
    cache = RadixCache(alloc, page_size=1)
    cached(alloc, cache, [1, 2])
    cached(alloc, cache, [5, 6])
    cached(alloc, cache, [8, 9])
    cache.pin(cache.match([1, 2, 0], record=False).nodes)
    cache.pin(cache.match([5, 6, 0], record=False).nodes)
    cache.match([1, 2, 0])  # [5, 6] is now the least recently used pinned path
    seen = []
    cache.spill = lambda victims: seen.extend(
        (node.tokens, page, alloc.refcount(page)) for node, page in victims
    )
    assert cache.evict(6) == 2  # without `pinned`, only the unpinned path goes
    assert seen == []
    assert cache.evict(3, pinned=True) == 3
    # Tail before head, and the hook saw each page while the tree still held it.
    assert [(tokens, count) for tokens, _, count in seen] == [((6,), 1), ((5,), 1), ((2,), 1)]
    assert alloc.num_free == 5 and cache.num_pages == 1
    assert cache.spilled_pages() == 3
    match = cache.match([1, 2, 0], record=False)
    assert match.num_pages == 1 and match.spilled


def test_a_page_a_sequence_holds_never_gives_way():
    alloc = PageAllocator(2)
    cache = RadixCache(alloc, page_size=1)
    pages = cached(alloc, cache, [1, 2])
    cache.pin(cache.match([1, 2, 0], record=False).nodes)
    alloc.retain(pages[1])  # a running sequence reuses the whole prefix
    assert cache.evict(2, pinned=True) == 0


def test_spilled_nodes_fill_again_and_are_forgotten_when_unpinned():
    alloc = PageAllocator(3)
    cache = RadixCache(alloc, page_size=1)
    cached(alloc, cache, [1, 2, 3])
    handle = cache.match([1, 2, 3, 0], record=False).nodes
    cache.pin(handle)
    assert cache.evict(2, pinned=True) == 2
    assert [n.resident for n in handle] == [True, False, False]
    # A prefill (or a restore) of the same tokens gives the nodes pages again, pinned.
    cached(alloc, cache, [1, 2])
    assert [n.resident for n in handle] == [True, True, False]
    assert cache.num_pages == 2 and alloc.num_free == 1
    cache.unpin(handle)
    assert cache.spilled_pages() == 0  # the last node, pageless and unpinned, is gone
    assert cache.match([1, 2, 3, 0], record=False).num_pages == 2
    assert not cache.match([1, 2, 3, 0], record=False).spilled
    assert cache.evict(2) == 2 and alloc.num_free == 3


def entry(key: bytes, size: int = 10, depth: int = 0) -> HostEntry:
    return HostEntry.of(key, b"parent", depth, [1, 2], "", bytes([len(key)]) * size)


def test_host_tier_budget_and_lru_order():
    tier = HostTier(budget_bytes=25)
    assert tier.put([entry(b"a"), entry(b"b")]) == []
    assert tier.take(b"a", b"parent", 0, [1, 2]) is not None  # taken: gone from the tier
    # "a" again and "c": 30 bytes, so the least recently put, "b", goes.
    assert [e.key for e in tier.put([entry(b"a"), entry(b"c")])] == [b"b"]
    assert list(tier._entries) == [b"a", b"c"] and tier.bytes == 20
    # An entry larger than the whole budget is handed straight back.
    assert [e.key for e in tier.put([entry(b"d", size=30)])] == [b"a", b"c", b"d"]
    assert len(tier) == 0 and tier.bytes == 0


def test_host_tier_refuses_what_does_not_check_out():
    tier = HostTier(budget_bytes=100)
    tier.put([entry(b"a"), entry(b"b"), entry(b"c")])
    assert tier.take(b"a", b"other parent", 0, [1, 2]) is None
    assert tier.take(b"b", b"parent", 0, [1, 3]) is None
    tier._entries[b"c"].payload = b"x" * 10  # damaged in memory
    assert tier.take(b"c", b"parent", 0, [1, 2]) is None
    assert tier.dropped_damaged == 3 and len(tier) == 0 and tier.bytes == 0


@pytest.mark.parametrize(
    "layout,kv_dtype",
    [
        (KVLayout(2, "gqa", 2, 8), "fp8_e4m3"),
        (KVLayout(2, "gqa", 2, 8), "bf16"),
        (MLALayout(2, "mla", latent_dim=12, rope_dim=4), "fp8_e4m3"),
    ],
)
def test_batched_page_bytes_match_single_pages(layout, kv_dtype):
    source = make_pool(layout, 6, 4, kv_dtype, torch.device("cpu"))
    raw = source.storage.view(torch.uint8)
    raw.copy_(torch.randint(0, 120, raw.shape, dtype=torch.uint8))
    data = source.pages_bytes([4, 1, 3])
    assert data == [source.page_bytes(p) for p in (4, 1, 3)]
    target = make_pool(layout, 6, 4, kv_dtype, torch.device("cpu"))
    target.load_pages_bytes([0, 5, 2], data)
    assert [target.page_bytes(p) for p in (0, 5, 2)] == data
    assert target.page_bytes(1) == bytes(len(data[0]))  # nothing else written
    with pytest.raises(ValueError):
        target.load_pages_bytes([1], [data[0][:-1]])


def test_a_failing_spill_hook_still_returns_the_pages():
    alloc = PageAllocator(2)
    cache = RadixCache(alloc, page_size=1)
    cached(alloc, cache, [1, 2])
    cache.pin(cache.match([1, 2, 0], record=False).nodes)

    def broken(victims):
        raise RuntimeError("no memory for the copy")

    cache.spill = broken
    with pytest.raises(RuntimeError):
        cache.evict(2, pinned=True)
    assert alloc.num_free == 2 and cache.num_pages == 0


@pytest.mark.parametrize("disk", [False, True], ids=["spill-tier", "and-disk-tier"])
def test_a_dropped_engine_frees_its_pool_without_the_cycle_collector(
    tiny_llama_dir, tmp_path, disk
):
    """The tree's spill hook points back at the spill tier, and the disk tier's store at
    its engine: no reference cycle may keep a dropped engine's KV pool alive (a test
    suite creating many engines ran out of memory before the cycle collector got to
    them)."""
    import gc
    import weakref

    from engine import LLM

    tier = {"kv_disk": True, "kv_disk_dir": str(tmp_path)} if disk else {}
    enabled = gc.isenabled()
    gc.disable()
    try:
        llm = LLM(str(tiny_llama_dir), kv_memory=0.01, **tier)
        llm.generate([[1, 2, 3, 4, 5]])
        pool = weakref.ref(llm.engine.pool)
        del llm
        assert pool() is None
    finally:
        if enabled:
            gc.enable()
