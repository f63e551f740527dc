"""The DSA cache: indexer keys beside the MLA latent in the same pages, carried whole by
the prefix cache's host and disk tiers (engine/kv/dsa_pool.py)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.kv.dsa_layout import DSALayout
from engine.kv.pools import make_pool
from engine.kv.sizing import kv_bytes_per_token
from tests.engine.dsa_checkpoints import build_glm_moe_dsa

PAGE = 16
PREFIX = list(range(3, 3 + 5 * PAGE))  # five full pages, sparse past index_topk = 8
TAIL = [7, 8, 9]
BIG = [250] * 120  # with 8 generated tokens: every page of an 8-page pool
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
LAYOUT = DSALayout(
    num_layers=3, kind="mla", latent_dim=24, rope_dim=8, index_dim=16, index_layers=(0, 2)
)


@pytest.fixture(scope="module")
def glm_path(tmp_path_factory):
    return build_glm_moe_dsa(tmp_path_factory.mktemp("dsa_cache") / "tiny")


def _filled_pool(kv_dtype: str, seed: int = 0):
    pool = make_pool(LAYOUT, 6, PAGE, kv_dtype, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    slots = torch.arange(6 * PAGE)
    for layer in range(3):
        latent = torch.randn(len(slots), 16, generator=generator)
        pool.write(layer, latent, torch.randn(len(slots), 8, generator=generator), slots)
    for layer in (0, 2):
        pool.write_index_keys(layer, torch.randn(len(slots), 16, generator=generator), slots)
    return pool


@pytest.mark.parametrize("kv_dtype", ["float32", "bf16", "fp8_e4m3"])
def test_a_page_carries_its_indexer_keys(kv_dtype):
    source = _filled_pool(kv_dtype)
    assert source.index_storage.dtype == (
        torch.float32 if kv_dtype == "float32" else torch.bfloat16
    )
    data = source.pages_bytes([4, 1, 3])
    assert data == [source.page_bytes(p) for p in (4, 1, 3)]
    assert len(data[0]) == PAGE * kv_bytes_per_token(LAYOUT, kv_dtype)
    target = make_pool(LAYOUT, 6, PAGE, kv_dtype, torch.device("cpu"))
    target.load_pages_bytes([0, 5, 2], data)
    target.load_page_bytes(1, source.page_bytes(1))
    for page, origin in ((0, 4), (5, 1), (2, 3), (1, 1)):
        here = torch.arange(page * PAGE, (page + 1) * PAGE)
        there = torch.arange(origin * PAGE, (origin + 1) * PAGE)
        for layer in (0, 2):
            assert torch.equal(
                target.gather_index_keys(layer, here), source.gather_index_keys(layer, there)
            )
        assert torch.equal(target.storage[:, here], source.storage[:, there])
    with pytest.raises(KeyError, match="no indexer"):
        source.gather_index_keys(1, torch.arange(4))


def _bytes_per_token() -> int:
    return kv_bytes_per_token(LAYOUT, "float32")


def _pinned_and_pushed_out(llm: LLM):
    first = llm.generate([PREFIX + TAIL], GREEDY)[0]
    handle = llm.engine.pin_prefix(PREFIX)
    before = _prefix_bytes(llm)
    assert len(handle) == len(before) == 5
    llm.generate([BIG], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    return first, before


def _prefix_bytes(llm: LLM) -> list[bytes]:
    engine = llm.engine
    pages = engine.prefix_cache.match(PREFIX + [0], record=False).pages
    return [engine.pool.page_bytes(p) for p in pages]


def test_spilled_prefix_comes_back_from_host_with_its_indexer_keys(glm_path):
    per_page = _bytes_per_token() * PAGE
    llm = LLM(
        str(glm_path),
        dtype="float32",
        kv_cache_dtype="auto",
        max_model_len=128,
        kv_memory=8 * per_page / 1024**3,  # one 128-token sequence and nothing else
        kv_host_gib=16 * per_page / 1024**3,
        verify_prefix_cache=True,  # restored pages are hashed on entry and checked on reuse
    )
    first, before = _pinned_and_pushed_out(llm)
    assert llm.engine.stats()["kv_spilled_to_host_pages"] == 5
    again = llm.generate([PREFIX + TAIL], GREEDY)[0]
    assert again.num_cached_tokens == 80  # restored, not prefilled
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert _prefix_bytes(llm) == before


def test_prefix_restored_from_disk_with_its_indexer_keys(glm_path, tmp_path):
    settings = dict(dtype="float32", kv_cache_dtype="fp8_e4m3", kv_disk=True, kv_memory=0.01)
    saver = LLM(str(glm_path), kv_disk_dir=str(tmp_path / "kv"), **settings)
    first = saver.generate([PREFIX + TAIL], GREEDY)[0]
    assert saver.engine.save_prefix(PREFIX) == 5
    fresh = LLM(str(glm_path), kv_disk_dir=str(tmp_path / "kv"), **settings)
    assert fresh.engine.restore_prefix(PREFIX) == 80
    assert _prefix_bytes(fresh) == _prefix_bytes(saver)
    restored = fresh.generate([PREFIX + TAIL], GREEDY)[0]
    assert restored.num_cached_tokens == 80
    assert restored.outputs[0].token_ids == first.outputs[0].token_ids
