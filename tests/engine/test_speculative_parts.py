"""Speculative decoding's parts on their own: acceptance, prompt lookup, adaptive k."""

from __future__ import annotations

import pytest

from engine.requests.params import SamplingParams
from engine.requests.sequence import Sequence
from engine.speculative import Speculator
from engine.speculative.adaptive import AdaptiveK
from engine.speculative.prompt_lookup import PromptLookupProposer
from engine.speculative.verifier import accept_prefix


def seq_of(prompt: list[int], output: list[int] = (), **params) -> Sequence:
    params.setdefault("temperature", 0)
    params.setdefault("max_tokens", 100)
    seq = Sequence("r", list(prompt), SamplingParams(**params))
    seq.output_token_ids = list(output)
    return seq


@pytest.mark.parametrize(
    "draft, targets, emitted",
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # all accepted, plus the bonus token
        ([1, 2, 3], [1, 9, 3, 4], [1, 9]),  # stops at the first disagreement
        ([1, 2, 3], [7, 2, 3, 4], [7]),  # nothing accepted: a plain decode step's token
        ([5], [5, 6], [5, 6]),
    ],
)
def test_accept_prefix(draft, targets, emitted):
    assert accept_prefix(draft, targets) == emitted


def test_accept_prefix_needs_one_row_per_draft_token_plus_one():
    with pytest.raises(ValueError):
        accept_prefix([1, 2], [1, 2])


def test_prompt_lookup_copies_what_followed_the_latest_longest_match():
    proposer = PromptLookupProposer(max_ngram=3, min_ngram=2)
    # "7 8 9" occurs twice; the later occurrence is followed by 40 41 42.
    prompt = [1, 7, 8, 9, 20, 21, 5, 7, 8, 9, 40, 41, 42, 3, 8, 9]
    seq = seq_of(prompt)
    # Suffix "3 8 9" is new, "8 9" matches: its latest continuation is 40 41 42.
    assert proposer.propose(seq, 3) == [40, 41, 42]
    seq.output_token_ids = [40, 1, 7, 8, 9]  # "7 8 9": the latest occurrence, not the first
    assert proposer.propose(seq, 2) == [40, 41]


def test_prompt_lookup_prefers_the_longer_ngram():
    proposer = PromptLookupProposer(max_ngram=3, min_ngram=2)
    # "2 3" last occurs before 99, but "1 2 3" only before 50.
    seq = seq_of([1, 2, 3, 50, 51, 8, 2, 3, 99, 4, 1, 2, 3])
    assert proposer.propose(seq, 2) == [50, 51]


def test_prompt_lookup_has_no_guess_without_a_match_and_extends_its_index():
    proposer = PromptLookupProposer(max_ngram=3, min_ngram=2)
    seq = seq_of([1, 2, 3, 4, 5])
    assert proposer.propose(seq, 4) == []
    seq.output_token_ids = [6, 2, 3]  # appended after the first proposal
    assert proposer.propose(seq, 2) == [4, 5]
    assert proposer.propose(seq, 0) == []


def test_prompt_lookup_extends_a_run_periodically():
    proposer = PromptLookupProposer(max_ngram=3, min_ngram=2)
    seq = seq_of([9, 1, 2, 1, 2, 1, 2])
    assert proposer.propose(seq, 5) == [1, 2, 1, 2, 1]


def test_prompt_lookup_goes_on_copying_where_the_last_verified_draft_came_from():
    """In a file with a repeated line the latest occurrence of the suffix is often the
    wrong one: the copy the model follows goes on after the cursor."""
    proposer = PromptLookupProposer(max_ngram=2, min_ngram=2)
    file = [1, 2, 3, 10, 4, 5, 6, 11, 4, 5, 6, 12, 7, 8, 9]
    seq = seq_of([*file, 0, 1, 2])
    assert proposer.propose(seq, 2) == [3, 10]
    proposer.verified(seq, 2, 1)  # "3" kept; the model wrote 99 where the file has 10
    seq.output_token_ids = [3, 99, 4, 5]
    # The latest "4 5" is the file's second (then 6, 12); the copy is at its first.
    assert proposer.propose(seq, 2) == [6, 11]
    proposer.verified(seq, 2, 2)  # both kept, then the model's own "4"
    seq.output_token_ids += [6, 11, 4, 5]
    # Now the latest "4 5" is the output's own (then 6, 11); the copy is at the file's
    # second line.
    assert proposer.propose(seq, 2) == [6, 12]


def test_prompt_lookup_forgets_the_copy_when_nothing_matches():
    proposer = PromptLookupProposer(max_ngram=2, min_ngram=2)
    seq = seq_of([1, 2, 3, 4, 5, 6, 1, 2, 9, 0, 3, 4])
    assert proposer.propose(seq, 1) == [5]
    proposer.verified(seq, 1, 1)
    seq.output_token_ids = [5, 77, 78]  # new text: no match, the cursor goes
    assert proposer.propose(seq, 2) == []
    seq.output_token_ids += [1, 2]
    assert proposer.propose(seq, 1) == [9]  # the latest "1 2" again


def test_adaptive_k_grows_on_full_acceptance_and_shrinks_on_rejection():
    k = AdaptiveK(k_max=8, k=4)
    k.update(4, 4)
    assert k.allow() == 6
    k.update(6, 6)
    k.update(8, 8)
    assert k.allow() == 8  # bounded
    k.update(8, 3)
    assert k.allow() == 7
    for _ in range(10):
        k.update(1, 0 if k.k > 1 else 1)
    assert 1 <= k.k <= 8


def test_adaptive_k_pauses_after_repeated_first_token_misses():
    k = AdaptiveK(k_max=8, k=2)
    k.update(2, 0)
    k.update(1, 0)
    assert [k.allow() for _ in range(5)] == [0, 0, 0, 0, 1]


def test_speculator_drafts_for_requests_without_penalties():
    spec = Speculator("prompt_lookup", max_draft=4, max_model_len=1000)
    prompt = [1, 2, 3, 4, 1, 2]
    assert spec.draft(seq_of(prompt), limit=10) == [3, 4, 1, 2]
    assert spec.draft(seq_of(prompt, temperature=0.7), limit=10) == [3, 4, 1, 2]
    assert spec.draft(seq_of(prompt, repetition_penalty=1.1), limit=10) == []
    assert spec.draft(seq_of(prompt, presence_penalty=0.5), limit=10) == []
    assert spec.draft(seq_of(prompt, speculative=False), limit=10) == []
    off_by_default = Speculator("none", max_draft=4, max_model_len=1000)
    assert off_by_default.draft(seq_of(prompt), limit=10) == []
    assert off_by_default.draft(seq_of(prompt, speculative=True), limit=10) == [3, 4, 1, 2]


def test_speculator_never_drafts_past_max_tokens_the_context_or_the_budget():
    prompt = [1, 2, 3, 4, 5, 6, 1, 2]
    spec = Speculator("prompt_lookup", max_draft=8, max_model_len=1000)
    seq = seq_of(prompt, [3], max_tokens=4)  # 3 more tokens at most, one of them the bonus
    assert len(spec.draft(seq, limit=10)) == 2
    assert len(spec.draft(seq_of(prompt), limit=1)) == 1
    short = Speculator("prompt_lookup", max_draft=8, max_model_len=len(prompt) + 3)
    assert len(short.draft(seq_of(prompt), limit=10)) == 2


def test_serve_flag_is_checked_and_reaches_the_engine_config():
    from engine.server.launch import ServeOptions, ServeUsageError, check_options

    with pytest.raises(ServeUsageError, match="--speculative"):
        check_options(ServeOptions(model="m", speculative="draft_model"))
    assert check_options(ServeOptions(model="m", speculative="prompt_lookup")).speculative
