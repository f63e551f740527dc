"""Sampling: seeds, top-k/top-p, stops, logprobs."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampling.filters import filtered_probs
from tests.engine.checkpoints import reference_logits

PROMPT = [5, 17, 42, 99, 3, 250, 7]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")


def _tokens(llm, params, prompts=None):
    outs = llm.generate(prompts or [PROMPT], params)
    return [o.outputs[0].token_ids for o in outs]


def test_seed_reproducible_and_independent_of_batch(llm):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = _tokens(llm, params)[0]
    assert _tokens(llm, params)[0] == alone
    batch = _tokens(llm, params, [PROMPT, [9, 9, 9], PROMPT[:3]])
    assert batch[0] == alone
    other = _tokens(llm, SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True))
    assert other[0] != alone


def test_top_k_one_is_greedy(llm):
    greedy = _tokens(llm, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    top1 = _tokens(llm, SamplingParams(max_tokens=10, temperature=2.0, top_k=1, ignore_eos=True))
    assert greedy == top1


def test_filtered_probs_top_k_top_p_min_p():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])

    def kept(params, candidates=()):
        probs = filtered_probs(logits.clone().unsqueeze(0), [params], candidates)
        return probs[0].nonzero().flatten().tolist()

    assert kept(SamplingParams(top_k=2)) == [0, 1]
    probs = logits.softmax(-1)
    # top_p just above the first token's mass keeps exactly two tokens.
    p = float(probs[0]) + 0.01
    assert kept(SamplingParams(top_p=p)) == [0, 1]
    # The same cut when the search starts among the 2 largest and must widen.
    assert kept(SamplingParams(top_p=0.99), candidates=(2,)) == kept(SamplingParams(top_p=0.99))
    assert kept(SamplingParams(min_p=0.3)) == [0, 1]


def test_sampling_follows_distribution(llm):
    """Many seeded draws of the first token follow softmax(logits / T)."""
    logits = llm.prompt_logits(PROMPT)[-1]
    probs = (logits / 0.7).softmax(-1)
    counts = torch.zeros_like(probs)
    params = [SamplingParams(max_tokens=1, temperature=0.7, seed=s) for s in range(300)]
    for out in llm.generate([PROMPT] * 300, params):
        counts[out.outputs[0].token_ids[0]] += 1
    top = int(probs.argmax())
    assert abs(counts[top] / 300 - probs[top]) < 0.1


def test_stop_token_ids_and_eos(llm):
    free = _tokens(llm, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    stop_at = free[4]
    out = llm.generate(
        [PROMPT], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_at])
    )
    completion = out[0].outputs[0]
    assert completion.token_ids == free[: free.index(stop_at) + 1]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop_at


def test_stop_strings_cut_text(llm):
    full = llm.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    text = full[0].outputs[0].text
    assert len(text) > 6
    stop = text[3:6]
    out = llm.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0, stop=stop))[0]
    assert out.outputs[0].text == text[: text.index(stop)]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    kept = llm.generate(
        [PROMPT],
        SamplingParams(max_tokens=20, temperature=0, stop=stop, include_stop_str_in_output=True),
    )[0]
    assert kept.outputs[0].text == text[: text.index(stop) + len(stop)]


def test_max_tokens_and_finish_reason(llm):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 5 and out.outputs[0].finish_reason == "length"


def test_logprobs_match_reference(llm, tiny_llama_dir):
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=3, prompt_logprobs=2)
    out = llm.generate([PROMPT], params)[0]
    reference = torch.log_softmax(reference_logits(tiny_llama_dir, PROMPT), -1)
    sampled = out.outputs[0].logprobs[0]
    assert sampled.token_id == int(reference[-1].argmax())
    assert sampled.logprob == pytest.approx(float(reference[-1].max()), abs=1e-4)
    assert len(sampled.top) == 3
    prompt_lp = out.prompt_logprobs
    assert prompt_lp[0] is None and len(prompt_lp) == len(PROMPT)
    for i in range(1, len(PROMPT)):
        expected = float(reference[i - 1, PROMPT[i]])
        assert prompt_lp[i].token_id == PROMPT[i]
        assert prompt_lp[i].logprob == pytest.approx(expected, abs=1e-4)


def test_batched_greedy_rows_each_get_their_own_argmax_penalties_included():
    from engine.requests.sequence import Sequence
    from engine.sampling.sampler import Sampler

    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0], [0.0, 5.0, 4.0, 1.0], [9.0, 0.0, 0.0, 0.0]])
    plain = Sequence("a", [0], SamplingParams(temperature=0))
    # Token 1 was already produced; a strong repetition penalty demotes it below token 2.
    penalised = Sequence("b", [0], SamplingParams(temperature=0, repetition_penalty=4.0))
    penalised.output_token_ids.append(1)
    sampled = Sequence("c", [0], SamplingParams(temperature=0.5, seed=3))
    tokens = [token for token, _ in Sampler().sample(logits, [plain, penalised, sampled])]
    assert tokens == [1, 2, 0]
