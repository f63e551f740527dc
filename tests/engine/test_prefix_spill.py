"""Pinned prefix pages give way under pool pressure, spill to the host (or disk) tier,
and come back byte-identical instead of being prefilled (engine/kv/prefix_spill.py)."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

PAGE = 16
PREFIX = list(range(3, 3 + 5 * PAGE))  # five full pages: the pinned "snapshot"
TAIL = [7, 8, 9]
BIG = [250] * 120  # with 8 generated tokens: all 8 pages of the pool
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
BIG_PARAMS = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
BYTES_PER_TOKEN = {"fp8_e4m3": 128, "auto": 512}  # 2 layers x (K, V) x 2 heads x 16 dims


def make(model_dir, kv_cache_dtype="fp8_e4m3", pages=8, **overrides) -> LLM:
    """A pool of `pages` pages: 8 hold one 128-token sequence and nothing else, so a
    pinned 5-page prefix and BIG do not fit together."""
    kv_memory = BYTES_PER_TOKEN[kv_cache_dtype] * PAGE * pages / 1024**3
    settings = dict(dtype="float32", kv_cache_dtype=kv_cache_dtype, max_model_len=128)
    return LLM(str(model_dir), kv_memory=kv_memory, **settings, **overrides)


def host_pages(n: int, kv_cache_dtype="fp8_e4m3") -> float:
    """kv_host_gib holding exactly `n` pages."""
    return BYTES_PER_TOKEN[kv_cache_dtype] * PAGE * n / 1024**3


def prefix_bytes(llm: LLM) -> list[bytes]:
    engine = llm.engine
    pages = engine.prefix_cache.match(PREFIX + [0], record=False).pages
    return [engine.pool.page_bytes(p) for p in pages]


def pin_and_push_out(llm: LLM):
    """Prefill and pin PREFIX, then run BIG, which needs every page of the pool."""
    first = llm.generate([PREFIX + TAIL], GREEDY)[0]
    handle = llm.engine.pin_prefix(PREFIX)
    before = prefix_bytes(llm)
    assert len(handle) == len(before) == 5
    big = llm.generate([BIG], BIG_PARAMS)[0]
    assert big.outputs[0].finish_reason == "length" and big.error is None
    return first, handle, before


def assert_accounting(llm: LLM) -> None:
    """With nothing running, every page is free or held once, by the tree."""
    engine = llm.engine
    alloc, cache = engine.allocator, engine.prefix_cache
    assert not engine.has_unfinished()
    assert alloc.num_free + cache.num_pages == alloc.num_pages
    assert sum(alloc.refcount(p) for p in range(alloc.num_pages)) == cache.num_pages
    assert engine.stats()["used_tokens"] == 0


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "auto"])
def test_spilled_prefix_comes_back_from_host_byte_identical(tiny_llama_dir, kv_cache_dtype):
    llm = make(
        tiny_llama_dir,
        kv_cache_dtype,
        kv_host_gib=host_pages(16, kv_cache_dtype),
        verify_prefix_cache=True,  # restored pages are hashed on entry and checked on reuse
    )
    first, handle, before = pin_and_push_out(llm)
    scales = llm.engine.pool.scales()
    stats = llm.engine.stats()
    assert stats["kv_spilled_pages"] == stats["kv_spilled_to_host_pages"] == 5
    assert stats["kv_host_tier_pages"] == 5
    assert stats["kv_host_tier_bytes"] == 5 * len(before[0])
    assert stats["kv_host_tier_budget_bytes"] == 16 * len(before[0])
    assert stats["kv_spilled_pinned_tokens"] == 80
    assert all(not node.resident and node.pins == 1 for node in handle)
    assert_accounting(llm)

    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 80  # restored, not prefilled
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert prefix_bytes(llm) == before
    assert llm.engine.pool.scales() == scales
    stats = llm.engine.stats()
    assert stats["kv_restored_from_host_pages"] == 5
    assert stats["kv_host_tier_pages"] == stats["kv_host_tier_bytes"] == 0
    assert stats["kv_spilled_pinned_tokens"] == 0
    assert all(node.resident and node.pins == 1 for node in handle)  # pinned again
    assert_accounting(llm)
    llm.engine.unpin_prefix(handle)
    assert all(node.pins == 0 for node in handle)
    assert_accounting(llm)


def test_with_no_tier_the_prefix_is_prefilled_again_and_repinned(tiny_llama_dir):
    llm = make(tiny_llama_dir)  # CPU pool: host tier off by default; no disk tier
    first, handle, _ = pin_and_push_out(llm)
    stats = llm.engine.stats()
    assert stats["kv_host_tier_budget_bytes"] == 0
    assert stats["kv_spilled_pages"] == stats["kv_spill_dropped_pages"] == 5
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert all(node.resident and node.pins == 1 for node in handle)
    assert llm.generate([PREFIX + TAIL], GREEDY)[0].num_cached_tokens == 80
    llm.engine.unpin_prefix(handle)
    assert_accounting(llm)


def test_host_budget_keeps_the_head_of_the_prefix(tiny_llama_dir):
    llm = make(tiny_llama_dir, kv_host_gib=host_pages(3))
    first, handle, before = pin_and_push_out(llm)
    stats = llm.engine.stats()
    # Spilled tail first, so the budget pushed out the last two pages, not the first.
    assert stats["kv_host_tier_pages"] == 3
    assert stats["kv_spill_dropped_pages"] == 2
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 48
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert prefix_bytes(llm) == before  # three restored, two prefilled: the same bytes
    assert all(node.resident and node.pins == 1 for node in handle)
    assert_accounting(llm)


def test_host_overflow_goes_on_to_disk(tiny_llama_dir, tmp_path):
    llm = make(tiny_llama_dir, kv_host_gib=host_pages(3), kv_disk=True, kv_disk_dir=str(tmp_path))
    first, _, before = pin_and_push_out(llm)
    stats = llm.engine.stats()
    assert (stats["kv_spilled_to_host_pages"], stats["kv_spilled_to_disk_pages"]) == (5, 2)
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 80
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    stats = llm.engine.stats()
    assert (stats["kv_restored_from_host_pages"], stats["kv_restored_from_disk_pages"]) == (3, 2)
    assert prefix_bytes(llm) == before


def test_cpu_pool_spills_to_the_disk_tier(tiny_llama_dir, tmp_path):
    llm = make(tiny_llama_dir, kv_disk=True, kv_disk_dir=str(tmp_path))
    first, handle, before = pin_and_push_out(llm)
    assert llm.engine.stats()["kv_spilled_to_disk_pages"] == 5
    assert len(list(tmp_path.glob("*/pages/*.kvp"))) == 5
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 80
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert llm.engine.stats()["kv_restored_from_disk_pages"] == 5
    assert prefix_bytes(llm) == before
    assert all(node.resident and node.pins == 1 for node in handle)
    assert_accounting(llm)


def test_damaged_or_foreign_entries_mean_a_cold_prefill(tiny_llama_dir):
    llm = make(tiny_llama_dir, kv_host_gib=host_pages(16))
    first, _, before = pin_and_push_out(llm)
    host = llm.engine.prefix_spill.host
    entries = list(host._entries.values())
    third = next(e for e in entries if e.depth == 2)
    third.payload = bytes([third.payload[0] ^ 0x40]) + third.payload[1:]  # one flipped bit
    # Another salt shares nothing: its chain keys differ from the first page on.
    other = llm.engine.add_request(PREFIX + TAIL, GREEDY, "other", cache_salt="other")
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert other.num_cached_tokens == 0
    assert llm.engine.stats()["kv_restored_from_host_pages"] == 0
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 32  # pages 0 and 1; the damaged one and on: prefilled
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert prefix_bytes(llm) == before
    assert host.dropped_damaged == 1


def test_unpinning_a_spilled_prefix(tiny_llama_dir):
    llm = make(tiny_llama_dir, kv_host_gib=host_pages(16))
    first, handle, _ = pin_and_push_out(llm)
    llm.engine.unpin_prefix(handle)
    assert llm.engine.stats()["kv_spilled_pinned_tokens"] == 0  # the tree forgot them
    llm.engine.unpin_prefix(handle)  # twice is harmless
    assert all(node.pins == 0 for node in handle)
    # The host tier still has the pages: the next request brings them back, unpinned.
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 80
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    match = llm.engine.prefix_cache.match(PREFIX + [0], record=False)
    assert all(node.pins == 0 for node in match.nodes)
    assert_accounting(llm)


def test_a_waiting_request_does_not_push_pins_out_while_others_run(tiny_llama_dir):
    llm = make(tiny_llama_dir, pages=12, kv_host_gib=host_pages(16))
    engine = llm.engine
    llm.generate([PREFIX + TAIL], GREEDY)
    handle = engine.pin_prefix(PREFIX)
    engine.add_request([40] * 20, SamplingParams(max_tokens=3, ignore_eos=True), "small")
    engine.add_request([41] * 100, SamplingParams(max_tokens=3, ignore_eos=True), "big")
    engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["small"]
    assert engine.stats()["kv_spilled_pages"] == 0  # "big" waits for "small"'s pages
    while engine.has_unfinished():
        engine.step()
    assert engine.stats()["kv_spilled_pages"] == 0  # "small"'s cached pages sufficed
    assert all(node.resident for node in handle)


def test_host_tier_default_budget():
    from engine.config import EngineConfig
    from engine.kv.prefix_spill import DEFAULT_HOST_GIB, GIB, host_budget_bytes, physical_memory

    config = EngineConfig(model="m")
    assert host_budget_bytes(config, "cpu") == 0  # the pool is host memory already
    expected = int(min(DEFAULT_HOST_GIB * GIB, physical_memory() / 4))
    assert host_budget_bytes(config, "cuda") == expected > 0
    assert host_budget_bytes(EngineConfig(model="m", kv_host_gib=0), "cuda") == 0
    assert host_budget_bytes(EngineConfig(model="m", kv_host_gib=0.5), "cpu") == GIB // 2
    # Each tensor-parallel rank holds only its shard of a page: no tier.
    tp = EngineConfig(model="m", kv_host_gib=1, tensor_parallel_size=2)
    assert host_budget_bytes(tp, "cuda") == 0


def test_the_serve_flag_reaches_the_engine_config(monkeypatch):
    from typer.testing import CliRunner

    from engine.cli import engine_app
    from engine.server import launch

    seen = []
    monkeypatch.setattr(launch, "serve", lambda options: seen.append(options))
    runner = CliRunner()
    assert runner.invoke(engine_app, ["serve", "--kv-host-gib", "2.5"]).exit_code == 0
    assert runner.invoke(engine_app, ["serve"]).exit_code == 0
    assert [o.kv_host_gib for o in seen] == [2.5, None]
    assert launch.engine_config(seen[0]).kv_host_gib == 2.5
    assert launch.engine_config(seen[1]).kv_host_gib is None
