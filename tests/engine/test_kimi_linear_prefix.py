"""Prefix caching for Kimi Linear: a cached prefix is reused from a snapshot of the KDA
layers' recurrent state at a page boundary, and continues exactly as a cold run.

Comparisons are stated in tests/engine/kimi_linear_prefix_helpers.py (float32:
logits within 1e-4, greedy tokens up to the reference's first close call),
against a cold engine and against transformers.
"""

from __future__ import annotations

import logging

import pytest
import torch

from engine import SamplingParams
from tests.engine.agreement import assert_greedy_agrees, margins_of_output
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.kimi_linear_checkpoints import build_kimi_linear
from tests.engine.kimi_linear_prefix_helpers import (
    FP32_ATOL,
    GREEDY,
    STATE_BYTES,
    assert_like_cold,
    assert_states_accounted,
    kv_gib,
    make_llm,
    tokens,
)

SHARED = tokens(200, seed=1)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return build_kimi_linear(tmp_path_factory.mktemp("kimi_linear_prefix") / "model")


@pytest.fixture(scope="module")
def cold(path):
    """Greedy outputs of an engine that caches nothing, by prompt."""
    llm = make_llm(path, enable_prefix_caching=False)
    return lambda prompts, params=GREEDY: llm.generate(prompts, params)


def test_a_continued_conversation_reuses_the_first_prompt_whole(path, cold):
    llm = make_llm(path)
    first = llm.generate([SHARED[:150]], GREEDY)[0]
    assert first.num_cached_tokens == 0
    # The next turn: the first prompt, its answer and more. The state was kept at the
    # first prompt's last page boundary (149 // 16 * 16).
    prompt = SHARED[:150] + first.outputs[0].token_ids + tokens(20, seed=2)
    second = llm.generate([prompt], GREEDY)[0]
    assert second.num_cached_tokens == 144
    assert_like_cold(second, cold([prompt])[0])
    # And transformers, computing the whole prompt from its first token.
    out = second.outputs[0]
    assert assert_greedy_matches_reference(path, prompt, out.token_ids, FP32_ATOL) > 0
    want = torch.log_softmax(reference_logits(path, prompt)[-1], dim=-1)
    got = out.logprobs[0].top
    assert all(abs(got[t] - want[t].item()) < FP32_ATOL for t in got)
    assert_states_accounted(llm)


def test_prompts_that_part_mid_page_share_up_to_a_state(path, cold):
    """The first prompt keeps its state at its last page only; a second one parting from
    it mid-page finds no state at or before 128 and computes from the start, but stops at
    128, where the tree's pages for it end, so a third one reuses 128 tokens."""
    llm = make_llm(path)
    a = SHARED[:150]
    b = SHARED[:140] + tokens(12, seed=3)
    c = SHARED[:140] + tokens(12, seed=4)
    outs = [llm.generate([p], GREEDY)[0] for p in (a, b, c)]
    assert [o.num_cached_tokens for o in outs] == [0, 0, 128]
    for got, want in zip(outs, cold([a, b, c]), strict=True):
        assert_like_cold(got, want)
    assert_states_accounted(llm)


def test_chunked_prefill_keeps_a_state_at_each_chunk_end(path, cold):
    llm = make_llm(path, max_num_batched_tokens=32)
    a = SHARED[:150]  # chunks end at 32, 64, 96, 128, then the prompt's last page, 144
    b = SHARED[:140] + tokens(12, seed=3)
    d = SHARED[:100] + tokens(30, seed=5)
    outs = [llm.generate([p], GREEDY)[0] for p in (a, b, d)]
    assert [o.num_cached_tokens for o in outs] == [0, 128, 96]
    assert llm.engine.stats()["recurrent_snapshots_held"] >= 5
    for got, want in zip(outs, cold([a, b, d]), strict=True):
        assert_like_cold(got, want)
    assert_states_accounted(llm)


def test_a_prompt_stops_at_its_last_page_boundary_so_its_state_is_kept(path):
    llm = make_llm(path)
    seq = llm.engine.add_request(SHARED[:150], SamplingParams(max_tokens=1))
    llm.engine.step()
    assert seq.num_computed_tokens == 144  # one step more for the last six tokens
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert llm.engine.stats()["recurrent_snapshots_held"] == 1


def test_concurrent_sequences_share_one_prefix_state(path, cold):
    prompts = [SHARED[:130] + [9], SHARED[:135] + [8, 7], SHARED[:150], SHARED[:129] + [5] * 20]
    want = cold(prompts)
    together = make_llm(path)  # all four at once, with nothing cached: each computes
    outs = together.generate(prompts, GREEDY)
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0, 0]
    for got, expected in zip(outs, want, strict=True):
        assert_like_cold(got, expected)
    assert_states_accounted(together)
    warm = make_llm(path)
    warm.generate([SHARED[:140]], GREEDY)  # keeps the state at 128
    outs = warm.generate(prompts, GREEDY)  # all four load it in one step
    assert [o.num_cached_tokens for o in outs] == [128, 128, 128, 128]
    for got, expected in zip(outs, want, strict=True):
        assert_like_cold(got, expected)
    assert_states_accounted(warm)


def test_a_small_budget_evicts_pages_and_drops_states_and_stays_correct(path, cold):
    """27 pages (under three 10-page requests) and two snapshot entries."""
    llm = make_llm(path, kv_memory=kv_gib(27, 2), max_num_seqs=2, max_model_len=256)
    assert llm.engine.pool.num_pages == 27
    assert llm.engine.stats()["recurrent_snapshot_bytes"] == 2 * STATE_BYTES
    bases = [tokens(150, seed=10 + i) for i in range(3)]
    order = [bases[0], bases[0] + [3, 4], bases[1], bases[2], bases[0] + [5], bases[1] + [6]]
    order += [bases[2][:100] + [7] * 40, bases[2] + [8]]
    outs = [llm.generate([p], GREEDY)[0] for p in order]
    cached = [o.num_cached_tokens for o in outs]
    assert cached[1] == 144 and all(c % 16 == 0 for c in cached)
    assert llm.engine.stats()["recurrent_snapshots_dropped"] > 0
    for got, want in zip(outs, cold(order), strict=True):
        assert_like_cold(got, want)
    assert_states_accounted(llm)


def test_a_preempted_sequence_resumes_from_its_own_cached_state(path, cold):
    """Two 150-token prompts growing to 250 tokens (16 pages each) in 27 pages: one is
    preempted, and its recompute starts from the state kept at its prompt's end."""
    llm = make_llm(path, kv_memory=kv_gib(27, 2), max_num_seqs=2, max_model_len=256)
    long = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True, logprobs=2)
    prompts = [tokens(150, seed=30), tokens(150, seed=31)]
    seqs = [llm.engine.add_request(p, long) for p in prompts]
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert sum(seq.num_preemptions for seq in seqs) > 0
    assert max(seq.num_cached_tokens for seq in seqs) >= 144
    for seq, want in zip(seqs, cold(prompts, long), strict=True):
        margins = margins_of_output(want.outputs[0])
        assert assert_greedy_agrees(
            seq.output_token_ids, want.outputs[0].token_ids, margins, FP32_ATOL
        )
    assert_states_accounted(llm)


def test_prefix_caching_is_off_without_room_for_states_and_says_why(path, caplog):
    # Four running states and 96 tokens of pages: no room for a snapshot.
    kv_memory = (4 * STATE_BYTES + 96 * 192) / 1024**3
    with caplog.at_level(logging.INFO, logger="engine.core.prefix_tiers"):
        llm = make_llm(path, kv_memory=kv_memory, max_num_seqs=4, max_model_len=64)
    assert llm.engine.prefix_cache is None and llm.engine.parts.rank.snapshot_pool is None
    assert "recurrent state" in caplog.text and "no room" in caplog.text
    first, second = llm.generate([SHARED[:40], SHARED[:40] + [7]], GREEDY)
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 0


def test_a_model_without_recurrent_state_is_unchanged(tiny_llama_dir):
    llm = make_llm(tiny_llama_dir)
    engine = llm.engine
    assert engine.prefix_cache.snapshots is None and engine.scheduler.snapshot_points is None
    assert engine.parts.rank.snapshot_pool is None
    seq = engine.add_request(SHARED[:150], SamplingParams(max_tokens=1))
    engine.step()
    assert seq.num_computed_tokens == 150  # one step: no chunk is cut
    # Any cached page is reused, however the prompt parts from it.
    again = llm.generate([SHARED[:140] + [9] * 12], SamplingParams(max_tokens=1))[0]
    assert again.num_cached_tokens == 128
