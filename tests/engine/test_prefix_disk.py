"""The prefix cache's disk tier: save and restore byte-identical pages, refuse what
does not match or does not check out, honour the byte budget."""

from __future__ import annotations

import shutil

import pytest

from engine import LLM, SamplingParams
from engine.kv.disk_files import evict, summary
from engine.kv.disk_tier import DiskTier, PageRecord

PREFIX = list(range(3, 3 + 80))  # five full 16-token pages
TAIL = [7, 8, 9]
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def make(model_dir, disk, **overrides) -> LLM:
    settings = dict(dtype="float32", kv_cache_dtype="fp8_e4m3", kv_disk=True)
    settings.update(overrides)
    return LLM(str(model_dir), kv_disk_dir=str(disk), **settings)


def cached_pages(llm: LLM, tokens: list[int], salt: str = "") -> list[bytes]:
    engine = llm.engine
    pages = engine.prefix_cache.match(tokens + [0], salt, record=False).pages
    return [engine.pool.page_bytes(p) for p in pages]


def page_files(disk) -> list:
    return sorted(disk.glob("*/pages/*.kvp"))


@pytest.fixture(scope="module")
def saved_once(tiny_llama_dir, tmp_path_factory):
    """An FP8 engine that prefilled PREFIX (scales set from it) and saved it."""
    disk = tmp_path_factory.mktemp("saved") / "kv"
    llm = make(tiny_llama_dir, disk)
    first = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert llm.engine.save_prefix(PREFIX) == 5
    warm = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert warm.num_cached_tokens == 80
    return llm, disk, first


@pytest.fixture()
def saved(saved_once, tmp_path):
    """`saved_once`, with a copy of its disk tier each test may damage."""
    llm, disk, first = saved_once
    copy = tmp_path / "kv"
    shutil.copytree(disk, copy)
    return llm, copy, first


def test_restore_is_byte_identical_and_continues_alike(saved, tiny_llama_dir):
    original, disk, _ = saved
    assert len(page_files(disk)) == 5
    fresh = make(tiny_llama_dir, disk)
    assert fresh.engine.pool.calibrated_layers == 0
    assert fresh.engine.restore_prefix(PREFIX) == 80
    # The scale set was adopted, exactly, and the pages hold the same FP8 bytes.
    assert fresh.engine.pool.scales() == original.engine.pool.scales()
    assert fresh.engine.pool.scale_source == "disk"
    assert cached_pages(fresh, PREFIX) == cached_pages(original, PREFIX)
    restored = fresh.generate([PREFIX + TAIL], GREEDY)[0]
    again = original.generate([PREFIX + TAIL], GREEDY)[0]
    assert restored.num_cached_tokens == 80
    assert restored.outputs[0].token_ids == again.outputs[0].token_ids
    # Saving again writes nothing new; restoring what is cached loads nothing.
    assert fresh.engine.save_prefix(PREFIX) == 0
    assert fresh.engine.restore_prefix(PREFIX) == 0


def test_a_longer_prompt_restores_the_saved_part(saved, tiny_llama_dir):
    _, disk, _ = saved
    fresh = make(tiny_llama_dir, disk)
    assert fresh.engine.restore_prefix(PREFIX + list(range(200, 240))) == 80


def test_bf16_round_trip(tiny_llama_dir, tmp_path):
    disk = tmp_path / "kv"
    a = make(tiny_llama_dir, disk, kv_cache_dtype="auto")
    a.generate([PREFIX + TAIL], GREEDY)
    a.engine.save_prefix(PREFIX)
    b = make(tiny_llama_dir, disk, kv_cache_dtype="auto")
    assert b.engine.restore_prefix(PREFIX) == 80
    assert cached_pages(b, PREFIX) == cached_pages(a, PREFIX)


@pytest.mark.parametrize(
    "change",
    [
        {"kv_cache_dtype": "auto"},  # another KV dtype
        {"kv_rotation": "none"},  # another rotation
        {"page_size": 8},  # another page geometry
        {"cpu_weights": "q8_0"},  # weights rounded at load
    ],
)
def test_another_engine_state_never_matches(saved, tiny_llama_dir, change):
    _, disk, _ = saved
    other = make(tiny_llama_dir, disk, **change)
    assert other.engine.restore_prefix(PREFIX) == 0


def test_other_tokens_salt_model_or_scales_never_match(saved, tiny_llama_dir, tiny_qwen2_dir):
    _, disk, _ = saved
    fresh = make(tiny_llama_dir, disk)
    assert fresh.engine.restore_prefix([4] + PREFIX[1:]) == 0  # first token differs
    assert fresh.engine.restore_prefix(PREFIX, "tenant") == 0
    assert make(tiny_qwen2_dir, disk).engine.restore_prefix(PREFIX) == 0
    # Scales already in force (set by a different first prefill) must equal the saved ones.
    calibrated = make(tiny_llama_dir, disk)
    calibrated.generate([[(i * 7) % 300 + 10 for i in range(100)]], GREEDY)
    assert calibrated.engine.restore_prefix(PREFIX) == 0


def test_a_flipped_byte_or_truncated_file_means_prefill(saved, tiny_llama_dir):
    original, disk, _ = saved
    files = page_files(disk)
    data = bytearray(files[2].read_bytes())
    data[len(data) // 2] ^= 0x01
    files[2].write_bytes(bytes(data))
    files[4].write_bytes(files[4].read_bytes()[:-100])
    fresh = make(tiny_llama_dir, disk)
    assert fresh.engine.restore_prefix(PREFIX) == 32  # pages 0 and 1, then the damaged one
    assert not files[2].exists()  # a damaged file is dropped
    out = fresh.generate([PREFIX + TAIL], GREEDY)[0]
    assert out.num_cached_tokens == 32
    assert (
        out.outputs[0].token_ids
        == original.generate([PREFIX + TAIL], GREEDY)[0].outputs[0].token_ids
    )
    # Saving fills the gap; the truncated last page is refused once the chain reaches it.
    fresh.engine.save_prefix(PREFIX)
    again = make(tiny_llama_dir, disk)
    assert again.engine.restore_prefix(PREFIX) == 64
    assert not files[4].exists()


def test_the_budget_is_honoured_oldest_and_deepest_first(tmp_path):
    root = tmp_path / "kv"
    tier = DiskTier(root, "engine", budget_bytes=10**9)
    keys = [bytes([i]) * 16 for i in range(6)]
    for depth, key in enumerate(keys):
        tier.put_page(PageRecord(key, b"\0" * 16, depth, [depth], "", b"x" * 1000))
    tier.touch([(d, k) for d, k in enumerate(keys[:3])])
    tier.touch([(d, k) for d, k in enumerate(keys[3:], 3)])  # newer
    size = tier.page_path(0, keys[0]).stat().st_size
    assert evict(root, 4 * size) == 2
    left = {p.name.split("-")[0] for p in (root / "engine" / "pages").iterdir()}
    assert left == {"000000", "000003", "000004", "000005"}  # the old chain lost its tail
    assert summary(root)[0]["bytes"] == 4 * size


def test_saving_keeps_the_disk_under_its_budget(tiny_llama_dir, tmp_path):
    disk = tmp_path / "kv"
    page_file = None
    llm = make(tiny_llama_dir, disk, kv_disk_gib=1.0)
    llm.generate([PREFIX + TAIL], GREEDY)
    llm.engine.save_prefix(PREFIX)
    page_file = page_files(disk)[0].stat().st_size
    budget = 3 * page_file
    tight = make(tiny_llama_dir, disk, kv_disk_gib=budget / 1024**3)
    tight.generate([PREFIX + TAIL], GREEDY)
    other = list(range(230, 310))
    tight.generate([other + TAIL], GREEDY)
    tight.engine.save_prefix(other)
    assert sum(p.stat().st_size for p in page_files(disk)) <= budget


def test_async_restore_reads_files_off_the_engine_thread(saved, tiny_llama_dir, monkeypatch):
    """A server restoring a long prefix must not stall the batch while files are read."""
    import asyncio
    import threading

    from engine.async_engine import AsyncEngine

    original, disk, _ = saved
    read_on: list[str] = []
    get_page = DiskTier.get_page

    def recording(self, *args, **kwargs):
        read_on.append(threading.current_thread().name)
        return get_page(self, *args, **kwargs)

    monkeypatch.setattr(DiskTier, "get_page", recording)
    fresh = make(tiny_llama_dir, disk)

    async def restore() -> int:
        engine = AsyncEngine(engine=fresh.engine)
        try:
            return await engine.restore_prefix(PREFIX)
        finally:
            engine.shutdown()

    assert asyncio.run(restore()) == 80
    assert len(read_on) == 5 and "resident-engine" not in read_on
    assert cached_pages(fresh, PREFIX) == cached_pages(original, PREFIX)


def test_a_restore_planned_before_the_pool_took_other_scales_places_nothing(saved, tiny_llama_dir):
    """Between planning (scales free to adopt) and placing, a prefill set other scales:
    the saved FP8 bytes no longer mean anything in this pool."""
    _, disk, _ = saved
    fresh = make(tiny_llama_dir, disk)
    store = fresh.engine.prefix_store
    plan = store.plan(PREFIX)
    records = store.read(plan)
    assert plan is not None and len(records) == 5
    fresh.generate([list(range(200, 240))], GREEDY)  # calibrates the pool on other text
    assert fresh.engine.pool.calibrated_layers > 0
    assert store.place(plan, records) == 0


def test_a_restore_never_evicts_the_prefix_it_extends(tiny_llama_dir, tmp_path):
    disk = tmp_path / "kv"
    saver = make(tiny_llama_dir, disk, kv_cache_dtype="auto")
    expected = saver.generate([PREFIX + TAIL], GREEDY)[0].outputs[0].token_ids
    assert saver.engine.save_prefix(PREFIX) == 5
    per_token = 2 * 2 * 2 * 16 * 4  # layers x (K, V) x heads x head_dim x float32
    pages = 8  # with max_model_len 128: one sequence's worth
    llm = make(
        tiny_llama_dir,
        disk,
        kv_cache_dtype="auto",
        max_model_len=128,
        kv_memory=per_token * 16 * pages / 1024**3,
    )
    llm.generate([PREFIX[:32] + [1]], GREEDY)  # the prefix's first two pages, cached
    llm.generate([[300] * 90], GREEDY)  # five more cached pages: one page free
    handle = llm.engine.pin_prefix([300] * 90)
    # One saved page fits; room for more could only come from evicting the two
    # unpinned pages the restore builds on, which must stay.
    assert llm.engine.restore_prefix(PREFIX) == 16
    cache = llm.engine.prefix_cache
    held = [node.page for node in cache._nodes()]
    assert len(held) == len(set(held)) == cache.num_pages
    llm.engine.unpin_prefix(handle)
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 48
    assert again.outputs[0].token_ids == expected
