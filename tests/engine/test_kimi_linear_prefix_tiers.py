"""Kimi Linear prefixes through the prefix cache's tiers: a pinned prefix spilled to the
host tier, and one saved to the disk tier and restored by another engine, come back
with the recurrent state at their end, so they are reused whole and continue as the
cold run did; pages that come back without a state are reused only up to one.
Comparisons as in tests/engine/kimi_linear_prefix_helpers.py."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.engine.kimi_linear_checkpoints import build_kimi_linear
from tests.engine.kimi_linear_prefix_helpers import (
    GREEDY,
    PAGE_BYTES,
    STATE_BYTES,
    assert_like_cold,
    assert_states_accounted,
    kv_gib,
    make_llm,
    tokens,
)

PREFIX = tokens(144, seed=1)  # nine pages: the pinned "repository"
PROMPT = PREFIX + [5, 6, 7, 8, 9, 10]  # its last page boundary, 144, keeps the state


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_kimi_linear(tmp_path_factory.mktemp("kimi_linear_tiers") / "model")


def test_a_pinned_prefix_spilled_to_the_host_comes_back_with_its_state(path):
    """27 pages, two snapshot entries: a 300-token request pushes the pinned prefix's
    tail pages (the last one holding the state) out to the host tier."""
    llm = make_llm(
        path,
        kv_memory=kv_gib(27, 2),
        max_num_seqs=2,
        max_model_len=400,
        kv_host_gib=16 * (PAGE_BYTES + STATE_BYTES) / 1024**3,
    )
    first = llm.generate([PROMPT], GREEDY)[0]  # a cold run
    handle = llm.engine.pin_prefix(PREFIX)
    assert len(handle) == 9 and handle[-1].snapshot is not None
    big = llm.generate([tokens(300, seed=20)], GREEDY)[0]
    assert big.error is None
    stats = llm.engine.stats()
    assert stats["kv_spilled_to_host_pages"] > 0 and not handle[-1].resident
    assert stats["kv_host_tier_bytes"] > stats["kv_host_tier_pages"] * PAGE_BYTES  # a state
    again = llm.generate([PROMPT], GREEDY)[0]
    assert again.num_cached_tokens == 144  # restored with its state, not prefilled
    assert llm.engine.stats()["kv_restored_from_host_pages"] > 0
    assert handle[-1].resident and handle[-1].snapshot is not None
    assert_like_cold(again, first)
    llm.engine.unpin_prefix(handle)
    assert_states_accounted(llm)


def test_a_saved_prefix_is_restored_by_another_engine_with_its_state(path, tmp_path):
    disk = dict(kv_disk=True, kv_disk_dir=str(tmp_path))
    saver = make_llm(path, **disk)
    first = saver.generate([PROMPT], GREEDY)[0]
    assert saver.engine.save_prefix(PREFIX) == 9
    fresh = make_llm(path, **disk)
    assert fresh.engine.restore_prefix(PREFIX) == 144
    again = fresh.generate([PROMPT], GREEDY)[0]
    assert again.num_cached_tokens == 144
    assert_like_cold(again, first)
    assert fresh.engine.save_prefix(PREFIX) == 0  # the pages and their state are on disk
    assert_states_accounted(fresh)


def test_restored_pages_past_the_last_saved_state_are_not_reused(path, tmp_path):
    """A prompt and 40 generated tokens make 11 pages, whose only state is at the
    prompt's last page (144). Restored elsewhere, a continuation reuses 144 tokens and
    keeps a state at 176, where the restored pages end; the next one reuses all 176."""
    disk = dict(kv_disk=True, kv_disk_dir=str(tmp_path))
    saver = make_llm(path, **disk)
    long = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    answer = saver.generate([PROMPT], long)[0].outputs[0].token_ids
    history = (PROMPT + answer)[:176]
    assert saver.engine.save_prefix(history) == 11
    fresh = make_llm(path, **disk)
    assert fresh.engine.restore_prefix(history) == 176
    turns = [history + [1, 2, 3], history + [4, 5, 6, 7]]
    outs = [fresh.generate([p], GREEDY)[0] for p in turns]
    assert [o.num_cached_tokens for o in outs] == [144, 176]
    cold = make_llm(path, enable_prefix_caching=False).generate(turns, GREEDY)
    for got, want in zip(outs, cold, strict=True):
        assert_like_cold(got, want)
    assert_states_accounted(fresh)
