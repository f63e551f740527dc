"""Speculative decoding in the engine: greedy outputs identical to plain decoding,
alone and in batches mixing speculating and plain requests, and rollback that
leaves the pool's accounting exact and the prefix cache holding only verified tokens.

Small pages (4 tokens) so drafts of up to 8 tokens cross pages and rollback frees
whole pages. Float32 on the default (fast) path, where only summation order differs
(verification is a matrix of other rows): greedy tokens equal plain decoding's
wherever that cannot decide them (these random models do have near-ties, margins
down to 3e-5: tests/engine/agreement.py); BF16 and FP8 KV in deterministic mode, where
plain and speculative decoding must be bit-identical, logprobs included. Seeded
sampling is compared exactly: a flip needs a draw within about 1e-6 of a boundary
between two tokens' cumulative probabilities.
"""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.devtools.testing.checkpoints import build_deepseek_v3, tiny_llama
from tests.engine.agreement import assert_greedy_agrees, assert_outputs_agree, margins_of_output

REPEAT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33]
# How far float32 logits may move with the summation order (asserted against
# transformers at this bound by test_models_vs_transformers).
FLOAT32_LOGITS_TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A larger init than the default: outputs that neither loop on one token at
    # once nor look like noise, so drafts are accepted in part, in full and not at all.
    return tiny_llama(tmp_path_factory.mktemp("spec") / "model", initializer_range=0.1)


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 3 == 0:  # nothing to copy
            out.append([rng.randrange(3, 256) for _ in range(rng.randrange(5, 40))])
        elif i % 3 == 1:  # heavy repetition: long drafts
            out.append(REPEAT * rng.randrange(2, 5) + [rng.randrange(3, 256)])
        else:  # a random block, twice: a copy with a change
            block = [rng.randrange(3, 256) for _ in range(rng.randrange(8, 30))]
            out.append(block + [rng.randrange(3, 256)] + block[: rng.randrange(2, len(block))])
    return out


def greedy(speculative: bool | None, max_tokens: int = 24, **extra) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0,
        ignore_eos=True,
        speculative=speculative,
        **extra,
    )


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def assert_as_plain(outputs, plain) -> None:
    """Each greedy output equals plain decoding's (run with logprobs=2) up to its first
    close call."""
    for got, want in zip(outputs, plain, strict=True):
        assert_outputs_agree(got.outputs[0], want.outputs[0], FLOAT32_LOGITS_TOL)


def assert_pool_exact(llm: LLM) -> None:
    """Every page is free or held by the prefix cache alone; the cache holds only
    token runs some request really produced (prompt plus verified output)."""
    engine = llm.engine
    cache = engine.prefix_cache
    held = cache.num_pages if cache is not None else 0
    assert engine.allocator.num_free + held == engine.allocator.num_pages
    assert all(engine.allocator.refcount(p) == 0 for p in list(engine.allocator._free))


def cached_runs(llm: LLM) -> list[list[int]]:
    """Each root-to-leaf path of the prefix cache, as tokens."""
    runs = []
    stack = [(root, []) for root in llm.engine.prefix_cache.roots.values()]
    while stack:
        node, tokens = stack.pop()
        tokens = tokens + list(node.tokens)
        if not node.children and tokens:
            runs.append(tokens)
        stack.extend((child, tokens) for child in node.children.values())
    return runs


def assert_cache_verified(llm: LLM, sequences: list[list[int]]) -> None:
    for run in cached_runs(llm):
        assert any(seq[: len(run)] == run for seq in sequences), run


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(
        str(model_dir),
        dtype="float32",
        kv_cache_dtype="auto",
        page_size=4,
        speculative_max_draft=8,
    )


# Verification laid out as one-query rows (the CPU default) or as one extend (GPUs).
LAYOUTS = pytest.mark.parametrize("as_rows", [True, False], ids=["rows", "extend"])


@LAYOUTS
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identical_to_plain_decoding_alone_and_in_mixed_batches(llm, seed, as_rows):
    llm.engine.runner.verify_as_rows = as_rows
    batch = prompts(seed, 9)
    plain = llm.generate(batch, greedy(False, logprobs=2))
    llm.engine.prefix_cache.clear()
    before = llm.engine.speculator.stats()
    alone = [llm.generate([p], greedy(True))[0] for p in batch]
    assert_as_plain(alone, plain)
    # Half the requests speculate, half decode plainly, in one batch.
    mixed = llm.generate(batch, [greedy(i % 2 == 0) for i in range(len(batch))])
    assert_as_plain(mixed, plain)
    after = llm.engine.speculator.stats()
    drafted = after["speculative_drafted_tokens"] - before["speculative_drafted_tokens"]
    accepted = after["speculative_accepted_tokens"] - before["speculative_accepted_tokens"]
    assert 0 < accepted < drafted  # drafts were both kept and thrown away
    assert_pool_exact(llm)
    produced = [token_ids(plain), token_ids(alone), token_ids(mixed)]
    assert_cache_verified(llm, [p + o for run in produced for p, o in zip(batch, run, strict=True)])


class OracleProposer:
    """Drafts the true greedy continuation, corrupted at a random position (or not):
    every acceptance length from 0 to k, and rollbacks of several pages."""

    name = "oracle"

    def __init__(self, truth: dict[tuple[int, ...], list[int]], seed: int):
        self.truth = truth
        self.rng = random.Random(seed)

    def propose(self, seq, k):
        future = self.truth[tuple(seq.prompt_token_ids)][len(seq.output_token_ids) :][:k]
        draft = list(future) + [1] * (k - len(future))
        wrong = self.rng.randrange(len(draft) + 1)
        if wrong < len(draft):
            draft[wrong] = (draft[wrong] + 1 + self.rng.randrange(200)) % 256
        return draft

    def verified(self, seq, num_drafted, num_accepted):
        pass

    def release(self, seq):
        pass


@LAYOUTS
@pytest.mark.parametrize("seed", [3, 4])
def test_any_draft_gives_plain_output_and_exact_rollback(llm, seed, as_rows):
    llm.engine.runner.verify_as_rows = as_rows
    batch = prompts(seed, 8)
    plain_outputs = llm.generate(batch, greedy(False, max_tokens=30, logprobs=2))
    plain = token_ids(plain_outputs)
    engine = llm.engine
    truth = {tuple(p): out for p, out in zip(batch, plain, strict=True)}
    real = engine.speculator.proposer
    engine.speculator.proposer = OracleProposer(truth, seed)
    try:
        engine.prefix_cache.clear()
        free = engine.allocator.num_free
        before = engine.speculator.stats()["speculative_steps"]
        outs = llm.generate(batch, [greedy(i % 3 != 0, max_tokens=30) for i in range(8)])
        assert_as_plain(outs, plain_outputs)
        assert engine.speculator.stats()["speculative_steps"] > before
        assert_pool_exact(llm)
        produced = [plain, token_ids(outs)]
        ran = [p + o for run in produced for p, o in zip(batch, run, strict=True)]
        assert_cache_verified(llm, ran)
        engine.prefix_cache.clear()
        assert engine.allocator.num_free == free == engine.allocator.num_pages
    finally:
        engine.speculator.proposer = real


def test_stops_where_plain_decoding_stops(llm):
    prompt = REPEAT * 3
    reference = llm.generate([prompt], greedy(False, max_tokens=20, logprobs=2))[0].outputs[0]
    plain, margins = reference.token_ids, margins_of_output(reference)
    stop = plain[6]
    cut = plain.index(stop)
    # The choices up to the stop token are clear here (margins of 0.05 and more).
    assert min(margins[: cut + 1]) > 2 * FLOAT32_LOGITS_TOL
    for speculative in (False, True):
        out = llm.generate([prompt], greedy(speculative, stop_token_ids=[stop]))[0].outputs[0]
        assert out.token_ids == plain[: cut + 1]
        assert out.finish_reason == "stop"
    for max_tokens in (1, 2, 5, 7):
        spec = token_ids(llm.generate([prompt], greedy(True, max_tokens=max_tokens)))[0]
        assert_greedy_agrees(spec, plain[:max_tokens], margins[:max_tokens], FLOAT32_LOGITS_TOL)
    assert_pool_exact(llm)


def test_penalised_requests_do_not_speculate(llm):
    prompt = REPEAT * 3
    before = llm.engine.speculator.stats()["speculative_steps"]
    llm.generate([prompt], greedy(True, max_tokens=10, repetition_penalty=1.2))
    sampled = dict(max_tokens=10, temperature=0.8, seed=1, speculative=True)
    llm.generate([prompt], SamplingParams(presence_penalty=0.5, **sampled))
    assert llm.engine.speculator.stats()["speculative_steps"] == before
    llm.generate([prompt], greedy(True, max_tokens=10))
    assert llm.engine.speculator.stats()["speculative_steps"] > before


def sampled(speculative: bool, seed: int, **filters) -> SamplingParams:
    return SamplingParams(
        max_tokens=24,
        temperature=0.7,
        seed=seed,
        ignore_eos=True,
        speculative=speculative,
        **filters,
    )


FILTERS = [{}, {"top_p": 0.9}, {"top_k": 20, "min_p": 0.05}]


@LAYOUTS
def test_seeded_sampling_gives_the_same_tokens_with_and_without_speculation(llm, as_rows):
    """Each row is verified against the draw plain decoding would make with the same
    uniform, and the stream is rewound past the rejected rows: same seed, same tokens,
    alone and in a batch that mixes sampled, greedy, speculating and plain requests."""
    llm.engine.runner.verify_as_rows = as_rows
    batch = prompts(5, 9)
    params = [sampled(False, seed=i, **FILTERS[i % 3]) for i in range(len(batch))]
    plain = token_ids(llm.generate(batch, params))
    llm.engine.prefix_cache.clear()
    before = llm.engine.speculator.stats()
    spec = [sampled(True, seed=i, **FILTERS[i % 3]) for i in range(len(batch))]
    alone = [token_ids(llm.generate([p], [q]))[0] for p, q in zip(batch, spec, strict=True)]
    assert alone == plain
    mixed = [spec[i] if i % 2 == 0 else params[i] for i in range(len(batch))]
    mixed_batch = [*batch, REPEAT * 3]
    outs = token_ids(llm.generate(mixed_batch, [*mixed, greedy(True)]))
    assert outs[:-1] == plain
    after = llm.engine.speculator.stats()
    drafted = after["speculative_drafted_tokens"] - before["speculative_drafted_tokens"]
    accepted = after["speculative_accepted_tokens"] - before["speculative_accepted_tokens"]
    assert 0 < accepted < drafted
    assert_pool_exact(llm)


def test_each_row_is_the_draw_the_sampler_would_make_there():
    """Row i is what the sampler draws for this request after i earlier draws, and
    keep(n) leaves the request's stream where n plain draws leave it."""
    import torch

    from engine.requests.sequence import Sequence
    from engine.sampling.sampler import Sampler
    from engine.speculative.verifier import SampledTargets

    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(3)) * 3
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=7)
    targets = SampledTargets(logits, params, torch.Generator().manual_seed(7))
    seq = Sequence("r", [1], params)
    seq.generator = torch.Generator().manual_seed(7)
    plain = [Sampler().sample(logits[i : i + 1].clone(), [seq])[0][0] for i in range(5)]
    assert targets.tokens == plain
    for kept in (1, 3, 5):
        targets.keep(kept)
        again = torch.Generator().manual_seed(7)
        torch.rand(kept, generator=again)
        assert torch.equal(
            torch.rand(4, generator=targets.generator), torch.rand(4, generator=again)
        )


@LAYOUTS
@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_bit_identical_in_deterministic_mode(model_dir, kv, as_rows):
    llm = LLM(
        str(model_dir),
        dtype="bfloat16",
        kv_cache_dtype=kv,
        deterministic=True,
        page_size=4,
        speculative="prompt_lookup",
    )
    llm.engine.runner.verify_as_rows = as_rows
    batch = prompts(5, 6)
    llm.generate([REPEAT * 6], greedy(False, max_tokens=1))  # FP8: calibrate first
    plain = llm.generate(batch, greedy(False, logprobs=2))
    spec = llm.generate(
        batch, [greedy(None, logprobs=2) if i % 2 else greedy(False, logprobs=2) for i in range(6)]
    )
    alone = [llm.generate([p], greedy(None, logprobs=2))[0] for p in batch]
    assert llm.engine.speculator.stats()["speculative_accepted_tokens"] > 0
    for a, b, c in zip(plain, spec, alone, strict=True):
        assert b.outputs[0].token_ids == c.outputs[0].token_ids == a.outputs[0].token_ids
        logprobs = [(lp.logprob, lp.top) for lp in a.outputs[0].logprobs]
        assert [(lp.logprob, lp.top) for lp in c.outputs[0].logprobs] == logprobs
    assert_pool_exact(llm)


@LAYOUTS
def test_mla_checkpoint(tmp_path, as_rows):
    path = build_deepseek_v3(tmp_path / "dsv3", initializer_range=0.1)
    llm = LLM(str(path), dtype="float32", kv_cache_dtype="auto", page_size=4)
    llm.engine.runner.verify_as_rows = as_rows
    batch = prompts(6, 6)
    plain = llm.generate(batch, greedy(False, logprobs=2))
    spec = llm.generate(batch, [greedy(i % 2 == 0) for i in range(6)])
    assert_as_plain(spec, plain)  # one of these has a choice decided by 3e-5
    assert llm.engine.speculator.stats()["speculative_steps"] > 0
    assert_pool_exact(llm)
