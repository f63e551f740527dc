"""The multi-process engine in-process: LLM(tensor_parallel_size=2) against TP 1 on a tiny
Llama (gloo, float32), and shutdown by PID.

Each comparison is TP 2 against TP 1 on the same checkpoint: while the model layers
are replicated every rank computes the whole model, once they are sharded each
computes its slice, and the outputs must match either way.
"""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.errors import EngineError
from tests.engine.agreement import assert_outputs_agree
from tests.engine.distributed.helpers import is_running, kill_all

SETTINGS = dict(
    dtype="float32",
    kv_cache_dtype="auto",
    attention_backend="torch",
    kv_memory=0.01,
    # Small enough that prompts are prefilled in chunks beside other requests' decodes.
    max_num_batched_tokens=48,
)
_rng = random.Random(15)
PROMPTS = [[_rng.randrange(3, 320) for _ in range(n)] for n in (41, 7, 70, 23)]
SHARED = [_rng.randrange(3, 320) for _ in range(64)]  # four full pages
# float32: TP 2 sums each product's halves, then all-reduces them, in another order
# than TP 1; logits move by about 1e-6. Logprobs then move by at most twice the bound.
LOGITS_TOL = 1e-4
GREEDY = SamplingParams(max_tokens=10, temperature=0, logprobs=2, ignore_eos=True)
PARAMS = [
    GREEDY,
    SamplingParams(max_tokens=6, temperature=0, logprobs=2, prompt_logprobs=1, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=0.8, seed=7, logprobs=1, ignore_eos=True),
    GREEDY,
]


def _run(llm: LLM):
    batch = llm.generate(PROMPTS, PARAMS)
    first = llm.generate([SHARED + [5, 6, 7]], GREEDY)[0]
    second = llm.generate([SHARED + [9, 10]], GREEDY)[0]  # shares the 64-token prefix
    return batch, first, second


def _assert_same(tp1, tp2, params: SamplingParams = GREEDY) -> None:
    """Greedy: the same tokens up to TP 1's first close call (tests/engine/agreement.py),
    with their logprobs and those of the alternatives both list within the tolerance.
    Sampled (a seeded generator, the same draws on both): the same tokens, unless one of
    the 12 draws falls within about 1e-6 of a boundary between two tokens' cumulative
    probabilities (about 1e-5 in all): kept exact, as the sharper check."""
    want, got = tp1.outputs[0], tp2.outputs[0]
    if params.temperature == 0:
        compared = assert_outputs_agree(got, want, LOGITS_TOL)
    else:
        assert got.token_ids == want.token_ids
        compared = len(want.token_ids)
    for a, b in list(zip(want.logprobs, got.logprobs, strict=True))[:compared]:
        assert b.token_id == a.token_id
        assert abs(b.logprob - a.logprob) <= 2 * LOGITS_TOL
        for token in a.top.keys() & b.top.keys():
            assert abs(b.top[token] - a.top[token]) <= 2 * LOGITS_TOL
    if tp1.prompt_logprobs is not None:
        for a, b in zip(tp1.prompt_logprobs[1:], tp2.prompt_logprobs[1:], strict=True):
            assert abs(b.logprob - a.logprob) <= 2 * LOGITS_TOL


@pytest.fixture(scope="module")
def tp1_outputs(tiny_llama_dir):
    # No prefix cache: every TP 1 answer is computed cold.
    with LLM(str(tiny_llama_dir), enable_prefix_caching=False, **SETTINGS) as llm:
        return _run(llm)


@pytest.fixture
def tp2(tiny_llama_dir, tp1_outputs):  # after TP 1: a process holds one rank at a time
    """A TP 2 engine of the test's own (no test depends on what another did to one),
    closed and its workers gone by PID whatever the test did."""
    llm = LLM(str(tiny_llama_dir), tensor_parallel_size=2, **SETTINGS)
    pids = [w.pid for w in llm.engine.executor.workers]
    try:
        yield llm
    finally:
        llm.close()
        kill_all(pids)


def test_tp2_matches_tp1_with_batching_and_a_prefix_hit(tp2, tp1_outputs):
    batch, first, second = _run(tp2)
    tp1_batch, tp1_first, tp1_second = tp1_outputs
    for tp1, out, params in zip(tp1_batch, batch, PARAMS, strict=True):
        _assert_same(tp1, out, params)
    _assert_same(tp1_first, first)
    assert second.num_cached_tokens == 64  # the shared prefix came from the cache
    _assert_same(tp1_second, second)  # ... and gives what TP 1 computed cold


def test_stats_show_the_layout(tp2):
    assert tp2.engine.stats()["parallel"] == {"tp": 2, "ep": 1, "nnodes": 1, "ranks_alive": 2}


def test_calibration_over_prompts_is_refused(tp2):
    with pytest.raises(EngineError, match="tensor_parallel_size=1"):
        tp2.calibrate_kv_scales([[1, 2, 3]])


def test_one_process_holds_one_rank(tp2, tiny_llama_dir):
    with pytest.raises(EngineError, match="one process holds one rank"):
        LLM(str(tiny_llama_dir), **SETTINGS)


def test_close_stops_every_worker(tp2):
    pids = [w.pid for w in tp2.engine.executor.workers]
    assert pids and all(is_running(pid) for pid in pids)
    tp2.close()
    assert not any(is_running(pid) for pid in pids)
    tp2.close()  # twice is harmless
