"""Radix prefix cache: reuse, salts, LRU eviction, pinning, shared-page verification."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.kv.pages import PageAllocator
from engine.kv.radix import RadixCache, SharedPageCorrupted

PREFIX = list(range(3, 3 + 80))  # five full 16-token pages
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture()
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")


def test_repeated_prefix_is_served_from_cache(llm):
    cold = llm.generate([PREFIX + [7, 8]], GREEDY)[0]
    assert cold.num_cached_tokens == 0
    warm = llm.generate([PREFIX + [7, 8]], GREEDY)[0]
    assert warm.num_cached_tokens == 80
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    other_tail = llm.generate([PREFIX + [99]], GREEDY)[0]
    assert other_tail.num_cached_tokens == 80
    assert llm.engine.stats()["cache_hit_rate"] > 0


def test_whole_prompt_cached_still_computes_last_token(llm):
    prompt = PREFIX[:64]  # exactly four pages
    first = llm.generate([prompt], GREEDY)[0]
    again = llm.generate([prompt], GREEDY)[0]
    assert again.num_cached_tokens == 48  # the last page holds the token that must be computed
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_salts_do_not_share(llm):
    engine = llm.engine
    engine.add_request(PREFIX + [1], GREEDY, request_id="a", cache_salt="tenant-a")
    while engine.has_unfinished():
        engine.step()
    seq = engine.add_request(PREFIX + [1], GREEDY, request_id="b", cache_salt="tenant-b")
    engine.step()
    assert seq.num_cached_tokens == 0
    seq_same = engine.add_request(PREFIX + [1], GREEDY, request_id="c", cache_salt="tenant-a")
    while engine.has_unfinished():
        engine.step()
    assert seq_same.num_cached_tokens == 80


def test_abort_frees_pages_at_once(llm):
    engine = llm.engine
    baseline = engine.stats()["used_tokens"]
    engine.add_request(PREFIX, SamplingParams(max_tokens=100, ignore_eos=True), request_id="x")
    engine.step()
    assert engine.stats()["used_tokens"] > baseline
    engine.abort("x")
    assert engine.stats()["used_tokens"] == baseline
    assert not engine.has_unfinished()


def test_lru_eviction_and_pinning():
    alloc = PageAllocator(4)
    cache = RadixCache(alloc, page_size=2)
    old = alloc.allocate(2)
    cache.insert([1, 2, 3, 4], old)
    alloc.release(old)  # the sequence finished: only the cache holds them
    pinned_pages = alloc.allocate(2)
    cache.insert([9, 9, 8, 8], pinned_pages)
    alloc.release(pinned_pages)
    cache.pin(cache.match([9, 9, 8, 8, 0], record=False).nodes)
    assert alloc.num_free == 0
    cache.match([1, 2, 3, 4, 5])  # touch: still evictable, being unpinned
    assert cache.evict(4) == 2  # only the unpinned path goes
    assert alloc.num_free == 2
    assert cache.match([9, 9, 8, 8, 0]).num_pages == 2
    assert cache.match([1, 2, 3, 4, 0]).num_pages == 0


def test_eviction_prefers_least_recently_used():
    alloc = PageAllocator(3)
    cache = RadixCache(alloc, page_size=1)
    for token in (10, 20, 30):
        page = alloc.allocate(1)
        cache.insert([token], page)
        alloc.release(page)
    cache.match([10, 0])
    cache.match([30, 0])
    assert cache.evict(1) == 1
    assert cache.match([20, 0]).num_pages == 0
    assert cache.match([10, 0]).num_pages == 1


def test_scribble_on_shared_page_is_caught(tiny_llama_dir):
    llm = LLM(
        str(tiny_llama_dir), dtype="float32", kv_cache_dtype="fp8_e4m3", verify_prefix_cache=True
    )
    llm.generate([PREFIX + [5]], GREEDY)
    node = next(iter(llm.engine.prefix_cache.roots[""].children.values()))
    page = node.page
    llm.engine.pool.storage[0, page * 16 + 3].view(-1)[0] ^= 0x55  # one flipped byte
    with pytest.raises(SharedPageCorrupted):
        llm.generate([PREFIX + [6]], GREEDY)


def test_pinned_prefix_survives_pressure_and_gives_way_last(tiny_llama_dir):
    per_token = 2 * 2 * 2 * 16 * 4  # layers * (k, v) * kv_heads * head_dim * float32
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_dtype="auto",
        max_model_len=128,
        kv_memory=per_token * 16 * 12 / 1024**3,
    )
    llm.generate([PREFIX + [1]], GREEDY)
    handle = llm.engine.pin_prefix(PREFIX)
    assert len(handle) == 5
    for i in range(6):  # other prompts that need every unpinned page
        llm.generate([[200 + i] * 100], GREEDY)
    assert llm.generate([PREFIX + [1]], GREEDY)[0].num_cached_tokens == 80
    # A request that cannot fit beside the pinned pages makes the least recently used
    # of them give way (on a CPU pool with no disk tier they are dropped), not fail.
    assert len(llm.generate([[250] * 120], GREEDY)[0].outputs[0].token_ids) == 8
    stats = llm.engine.stats()
    assert stats["kv_spilled_pages"] == stats["kv_spill_dropped_pages"] == 1
    assert stats["kv_spilled_pinned_tokens"] == 16
    # The prefix's tail is prefilled again, and pinned again as it enters the tree.
    assert llm.generate([PREFIX + [1]], GREEDY)[0].num_cached_tokens == 64
    assert llm.engine.stats()["kv_spilled_pinned_tokens"] == 0
    assert all(node.pins == 1 for node in handle)
    llm.engine.unpin_prefix(handle)
    assert all(node.pins == 0 for node in handle)
    assert len(llm.generate([[250] * 120], GREEDY)[0].outputs[0].token_ids) == 8
