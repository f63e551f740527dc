"""The batched sampler (engine.sampling.sampler) against a per-row reference written from
the definitions: same tokens for the same uniforms, same logprobs, seeds
independent of the batch, the filtered distribution, and no vocabulary-wide
copy to the host."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import engine.sampling.sampler as sampler_module
from engine.requests.params import SamplingParams
from engine.requests.sequence import Sequence
from engine.sampling import filters
from engine.sampling.sampler import Sampler, token_logprobs

# ----- the reference: one row at a time, straight from the definitions ---------------


def reference_penalised(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """Repetition over prompt and output (CTRL), then frequency and presence over the
    output (OpenAI); nothing before the first generated token."""
    p, x = seq.params, row.clone()
    if not seq.output_token_ids:
        return x
    if p.repetition_penalty != 1:
        for token in set(seq.prompt_token_ids + seq.output_token_ids):
            value = x[token]
            x[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    for token, count in Counter(seq.output_token_ids).items():
        x[token] -= p.frequency_penalty * count + p.presence_penalty
    return x


def reference_probs(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The normalised float64 distribution a sampled row draws from."""
    x = row / params.temperature
    vocab = x.shape[0]
    keep = torch.ones(vocab, dtype=torch.bool)
    if 0 < params.top_k < vocab:
        kth = sorted(x.tolist(), reverse=True)[params.top_k - 1]
        keep &= x >= kth
    probs = torch.where(keep, x, float("-inf")).softmax(-1)
    if params.top_p < 1:
        covered = 0.0
        values = x.tolist()
        for token in sorted(range(vocab), key=lambda t: -values[t]):
            if covered > params.top_p:  # the tokens strictly before it cover top_p
                keep[token] = False
            covered += float(probs[token])
    probs = torch.where(keep, x, float("-inf")).softmax(-1)
    if params.min_p > 0:
        keep &= probs >= params.min_p * probs.max()
    probs = torch.where(keep, probs, 0.0).double()
    return probs / probs.sum()


def reference_draw(probs: torch.Tensor, u: float) -> int:
    """First token, in vocabulary order, whose cumulative probability exceeds u."""
    cdf = probs.cumsum(-1)
    return int((cdf > u * float(cdf[-1])).nonzero()[0])


def reference_sample(row: torch.Tensor, seq: Sequence, u: float | None) -> int:
    x = reference_penalised(row, seq)
    if seq.params.greedy:
        return int(torch.argmax(x))
    return reference_draw(reference_probs(x, seq.params), u)


# ----- helpers ----------------------------------------------------------------------

MIXED = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0, logprobs=3),
    SamplingParams(temperature=0, repetition_penalty=1.5, presence_penalty=0.5),
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.0, top_k=5, logprobs=0),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.7, min_p=0.1, logprobs=2),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.1, top_p=0.95, repetition_penalty=1.3, frequency_penalty=0.4),
    SamplingParams(temperature=2.0, top_k=1),  # greedy by top_k
    SamplingParams(temperature=1.0, presence_penalty=-1.0, frequency_penalty=1.5, logprobs=5),
]


def make_seq(index: int, params: SamplingParams, vocab: int, seed: int) -> Sequence:
    rng = torch.Generator().manual_seed(1000 + index)
    prompt = torch.randint(vocab, (12,), generator=rng).tolist()
    seq = Sequence(f"r{index}", prompt, params)
    # Outputs that repeat, so counts above one are exercised.
    seq.output_token_ids = torch.randint(vocab // 8, (9,), generator=rng).tolist()
    seq.generator = torch.Generator().manual_seed(seed)
    return seq


def next_uniform(seq: Sequence, generator_copy: dict[str, torch.Generator]) -> float:
    """The uniform the sampler takes from seq's generator at this step (a twin
    generator, seeded alike, advanced in step)."""
    return float(torch.rand(1, generator=generator_copy[seq.request_id]))


@pytest.mark.parametrize("vocab", [300, 4096])
def test_mixed_batch_matches_reference_tokens_and_logprobs(vocab, monkeypatch):
    # 4096 columns: top-p rows search 64 candidates, then 1024, then sort; with 4
    # (found by block maxima, filters.largest), then 16, rows widen, then sort. The
    # second pass also takes the rows three at a time (CPU chunks).
    for candidates, chunk in ((filters.TOP_P_CANDIDATES, None), ((4, 16), 3)):
        monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", candidates)
        if chunk:
            monkeypatch.setattr(sampler_module, "CPU_CHUNK_BYTES", chunk * vocab * 4)
        logits_rng = torch.Generator().manual_seed(vocab + candidates[0])
        seqs = [make_seq(i, p, vocab, seed=77 + i) for i, p in enumerate(MIXED)]
        twins = {s.request_id: torch.Generator().manual_seed(77 + i) for i, s in enumerate(seqs)}
        sampler = Sampler()
        for _ in range(12):
            logits = torch.randn(len(seqs), vocab, generator=logits_rng) * 3
            got = sampler.sample(logits, seqs)
            for row, (seq, (token, info)) in enumerate(zip(seqs, got, strict=True)):
                u = None if seq.params.greedy else next_uniform(seq, twins)
                assert token == reference_sample(logits[row], seq, u), (row, seq.params)
                if seq.params.logprobs is None:
                    assert info is None
                    continue
                own = torch.log_softmax(logits[row], -1)  # before penalties and filters
                assert info.token_id == token
                assert info.logprob == pytest.approx(float(own[token]), abs=1e-6)
                values, ids = own.topk(seq.params.logprobs)
                assert list(info.top) == ids.tolist()
                assert list(info.top.values()) == pytest.approx(values.tolist(), abs=1e-6)
            for seq, (token, _) in zip(seqs, got, strict=True):
                seq.output_token_ids.append(token)


def test_seeded_request_same_tokens_alone_and_in_any_batch():
    vocab = 500
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=5)

    def run(batch_size: int, position: int) -> list[int]:
        rng = torch.Generator().manual_seed(0)
        target = Sequence("target", [1, 2, 3], params, generator=torch.Generator().manual_seed(5))
        others = [
            Sequence(f"o{i}", [4], SamplingParams(temperature=0.5 + 0.1 * i, top_k=3 * i))
            for i in range(batch_size - 1)
        ]
        seqs = others[:position] + [target] + others[position:]
        sampler = Sampler(seed=position)
        for _ in range(10):
            row = torch.randn(vocab, generator=rng) * 2  # the target's logits, every run alike
            logits = torch.randn(len(seqs), vocab) * 2
            logits[position] = row
            for seq, (token, _) in zip(seqs, sampler.sample(logits, seqs), strict=True):
                seq.output_token_ids.append(token)
        return target.output_token_ids

    alone = run(1, 0)
    assert run(4, 2) == alone
    assert run(9, 8) == alone
    assert len(set(alone)) > 1  # it does sample


def test_draws_follow_the_filtered_distribution():
    """With a fixed seed, 40,000 draws over 8 tokens: every count within a bound
    that the true distribution would exceed with probability ~1e-9 (a chi-square
    of 50 on at most 7 degrees of freedom), and none of a filtered token."""
    logits = torch.tensor([2.0, 1.6, 1.5, 0.9, 0.3, 0.0, -0.5, -3.0])
    params = SamplingParams(temperature=0.8, top_k=7, top_p=0.93, min_p=0.04)
    expected = reference_probs(logits, params)
    assert 2 < int((expected > 0).sum()) < 7  # each filter matters here
    draws = 40_000
    seqs = [Sequence(str(i), [0], params) for i in range(draws)]
    tokens = [t for t, _ in Sampler(seed=11).sample(logits.expand(draws, -1).clone(), seqs)]
    counts = torch.bincount(torch.tensor(tokens), minlength=8).double()
    assert float(counts[expected == 0].sum()) == 0
    kept = expected > 0
    chi2 = float(((counts[kept] - draws * expected[kept]) ** 2 / (draws * expected[kept])).sum())
    assert chi2 < 50, (chi2, counts / draws, expected)


def test_no_vocabulary_wide_copy_to_the_host(monkeypatch):
    vocab = 4099  # a size nothing else in the step has (and not a multiple of the block)
    wide: list[tuple] = []
    sent: list[int] = []

    def watch(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            if self.dim() and self.shape[-1] == vocab:
                wide.append((name, tuple(self.shape)))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    for name in ("cpu", "tolist", "numpy", "item", "__array__"):
        watch(name)
    original_to_host = sampler_module.to_host
    monkeypatch.setattr(
        sampler_module, "to_host", lambda t: sent.append(t.numel()) or original_to_host(t)
    )
    seqs = [make_seq(i, p, vocab, seed=i) for i, p in enumerate(MIXED)]
    Sampler().sample(torch.randn(len(seqs), vocab), seqs)
    assert wide == []
    asked = [s.params.logprobs for s in seqs if s.params.logprobs is not None]
    # Token ids and top-n ids, then chosen and top-n values: nothing of vocabulary size.
    assert sent == [len(seqs) + len(asked) * max(asked), len(asked) * (1 + max(asked))]
    for seq in seqs:
        seq.params.logprobs = None
    sent.clear()
    Sampler().sample(torch.randn(len(seqs), vocab), seqs)
    assert sent == [len(seqs)] and wide == []


@pytest.mark.parametrize("candidates", [(), (2,), (2, 3)])
def test_ties_at_the_cuts_are_kept_whatever_the_search_width(candidates):
    """Equal logits (bf16 logits tie often) survive or fall together, so no sort
    order decides which of them a row may draw."""
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 0.0, -1.0]])

    def kept(params):
        probs = filters.filtered_probs(logits.clone(), [params], candidates)
        return probs[0].nonzero().flatten().tolist()

    probs = logits[0].softmax(-1)
    # The cut lands on the second of the tied tokens: all four are kept.
    assert kept(SamplingParams(top_p=float(probs[0] + probs[1]) + 0.01)) == [0, 1, 2, 3, 4]
    assert kept(SamplingParams(top_p=float(probs[0]) - 0.01)) == [0]
    assert kept(SamplingParams(top_k=2)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("k", [1, 5, 16, 64, 300])
def test_largest_is_topk(k):
    # 65,536 columns: block maxima up to k=64, torch.topk above.
    x = torch.randn(3, 65536, generator=torch.Generator().manual_seed(k))
    x[1, ::7] = 2.5  # ties: the values still agree, and the columns hold them
    values, columns = filters.largest(x, k)
    assert torch.equal(values, x.topk(k, -1).values)
    assert torch.equal(x.gather(1, columns), values)


def test_token_logprobs_of_verify_rows_match_log_softmax():
    logits = torch.randn(4, 50)
    entries = token_logprobs(logits, [3, 7, 1], 2)  # the last row is not accepted
    reference = torch.log_softmax(logits, -1)
    assert len(entries) == 3
    for row, (entry, token) in enumerate(zip(entries, [3, 7, 1], strict=True)):
        assert entry.token_id == token
        assert entry.logprob == pytest.approx(float(reference[row, token]), abs=1e-6)
        values, ids = reference[row].topk(2)
        assert list(entry.top) == ids.tolist()
        assert not math.isnan(entry.logprob)


def test_constrained_rows_report_the_models_own_logprobs(monkeypatch):
    """A grammar-masked row samples from its masked logits but reports logprobs of
    the copy apply_grammar_masks kept from before the mask; each token advances
    its grammar."""
    import engine.grammar.masks as masks

    class Grammar:
        done = False

        def __init__(self):
            self.accepted = []

        def accept(self, token):
            self.accepted.append(token)

    def fake_masks(logits, seqs):
        raw = {0: logits[0].clone()}
        logits[0, :40] = float("-inf")  # the grammar allows tokens 40.. only
        return raw

    monkeypatch.setattr(masks, "apply_grammar_masks", fake_masks)
    logits = torch.randn(2, 50) * 3
    logits[0, 0] = 20.0  # the model's favourite, which the grammar forbids
    seqs = [
        Sequence("g", [1], SamplingParams(temperature=0, logprobs=1), grammar=Grammar()),
        Sequence("s", [1], SamplingParams(temperature=1.0, logprobs=1), grammar=Grammar()),
    ]
    (token, info), (other, _) = Sampler().sample(logits.clone(), seqs)
    assert token == 40 + int(logits[0, 40:].argmax())
    own = torch.log_softmax(logits[0], -1)
    assert info.logprob == pytest.approx(float(own[token]), abs=1e-6)
    assert info.top == {0: pytest.approx(float(own[0]), abs=1e-6)}
    assert seqs[0].grammar.accepted == [token] and seqs[1].grammar.accepted == [other]
