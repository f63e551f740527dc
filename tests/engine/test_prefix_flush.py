"""Flushing the prefix cache (a router's /flush_cache): the tree, pinned pages included,
the host tier and the disk tier's page files go; pins and pages in use stay
(engine/core/prefix_tiers.py, PrefixTiers.flush)."""

from __future__ import annotations

from engine import SamplingParams
from tests.engine.test_prefix_spill import (
    GREEDY,
    PREFIX,
    TAIL,
    assert_accounting,
    host_pages,
    make,
    pin_and_push_out,
)

OTHER = [60] * 40  # an unpinned prompt: two full pages cached


def test_flush_drops_the_host_tier_and_keeps_the_pins(tiny_llama_dir):
    llm = make(tiny_llama_dir, kv_host_gib=host_pages(16))
    first, handle, before = pin_and_push_out(llm)  # five pinned pages now in the host tier
    llm.generate([OTHER], GREEDY)
    engine = llm.engine
    cached = engine.prefix_cache.num_pages
    assert cached >= 2 and engine.stats()["kv_host_tier_pages"] == 5

    report = engine.flush_prefix_cache()
    assert report["tokens"] == cached * 16
    assert report["pinned_tokens"] == 0  # the pinned pages had given way already
    assert report["in_use_tokens"] == 0
    assert (report["host_pages"], report["host_bytes"]) == (5, 5 * len(before[0]))
    assert (report["disk_pages"], report["disk_bytes"]) == (0, 0)
    stats = engine.stats()
    assert stats["cached_tokens"] == 0 and stats["kv_host_tier_pages"] == 0
    assert engine.prefix_cache.num_pages == 0
    assert all(node.pins == 1 and not node.resident for node in handle)  # the handle holds
    assert_accounting(llm)

    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 0  # nothing came back from the host tier
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert all(node.resident and node.pins == 1 for node in handle)  # cached, pinned again
    engine.unpin_prefix(handle)
    assert_accounting(llm)


def test_flush_drops_resident_pinned_pages_and_the_disk_tier(tiny_llama_dir, tmp_path):
    llm = make(tiny_llama_dir, kv_disk=True, kv_disk_dir=str(tmp_path))
    engine = llm.engine
    first = llm.generate([PREFIX + TAIL], GREEDY)[0]
    handle = engine.pin_prefix(PREFIX)
    assert engine.save_prefix(PREFIX) == 5
    pages_on_disk = list(tmp_path.glob("*/pages/*.kvp"))
    assert len(pages_on_disk) == 5
    disk_bytes = sum(page.stat().st_size for page in pages_on_disk)

    report = engine.flush_prefix_cache()
    assert report["tokens"] == report["pinned_tokens"] == 80
    assert (report["disk_pages"], report["disk_bytes"]) == (5, disk_bytes)
    assert list(tmp_path.glob("*/pages/*.kvp")) == []
    assert list(tmp_path.glob("*/scales/*.json"))  # scale sets name no prefix: kept
    assert engine.stats()["cached_tokens"] == 0
    assert engine.stats()["kv_spilled_pinned_tokens"] == 80  # pinned, without a page

    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 0  # neither memory nor disk had it
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert all(node.resident and node.pins == 1 for node in handle)
    assert llm.generate([PREFIX + TAIL], GREEDY)[0].num_cached_tokens == 80
    engine.unpin_prefix(handle)
    assert_accounting(llm)


def test_pages_a_running_request_holds_stay(tiny_llama_dir):
    llm = make(tiny_llama_dir, pages=12)
    engine = llm.engine
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    seq = engine.add_request(PREFIX, params, "running")
    engine.step()  # the prompt is prefilled: its full pages enter the tree, still held
    assert engine.has_unfinished()
    report = engine.flush_prefix_cache()
    assert report["tokens"] == 0 and report["in_use_tokens"] == 80  # its five full pages
    while engine.has_unfinished():
        engine.step()
    assert seq.is_finished
    assert engine.stats()["cached_tokens"] > 0  # cached as usual once it finished
    assert engine.flush_prefix_cache()["tokens"] > 0
    assert engine.stats()["cached_tokens"] == 0
    assert_accounting(llm)


def test_flush_without_prefix_caching_drops_nothing(tiny_llama_dir):
    llm = make(tiny_llama_dir, enable_prefix_caching=False)
    llm.generate([PREFIX + TAIL], GREEDY)
    report = llm.engine.flush_prefix_cache()
    assert set(report.values()) == {0}
