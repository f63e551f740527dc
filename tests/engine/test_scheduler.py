"""Continuous batching under pressure: preemption by recompute gives the same answers."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.kv.pages import PageAllocator


def test_preemption_recomputes_to_same_greedy_output(tiny_llama_dir):
    prompts = [[5 + i, 17, 42, 99, 3 + i, 250, 7, 61] for i in range(6)]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    roomy = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    # 64-token context, 16-token pages, 6 pages: six sequences of 48 tokens cannot all fit.
    per_token = roomy.engine.pool.layout.values_per_token * 4
    tight = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_dtype="auto",
        max_model_len=64,
        kv_memory=per_token * 16 * 6 / 1024**3,
    )
    assert tight.engine.capacity_tokens == 96
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    assert got == expected
    # Every page is free again or held only by the prefix cache.
    stats = tight.engine.stats()
    assert stats["used_tokens"] == 0
    assert tight.engine.allocator.num_free * 16 + stats["cached_tokens"] == 96


def test_chunked_prefill_under_small_token_budget(tiny_llama_dir):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompt = list(range(3, 100))
    big = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")
    small = LLM(
        str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto", max_num_batched_tokens=16
    )
    assert (
        small.generate([prompt, prompt[:20]], params)[0].outputs[0].token_ids
        == big.generate([prompt], params)[0].outputs[0].token_ids
    )


def test_page_allocator_refcounts():
    alloc = PageAllocator(4)
    pages = alloc.allocate(3)
    assert alloc.num_free == 1
    alloc.retain(pages[0])
    alloc.release(pages)
    assert alloc.num_free == 3 and alloc.refcount(pages[0]) == 1
    alloc.release([pages[0]])
    assert alloc.num_free == 4
    with pytest.raises(RuntimeError):
        alloc.release([pages[0]])
