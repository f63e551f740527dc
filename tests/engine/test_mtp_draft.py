"""MTP speculative decoding (--speculative mtp): the checkpoint's multi-token-prediction
layer drafts, the target verifies, and the outputs are plain decoding's.

Tiny random DeepSeek V3, GLM-4.5, DeepSeek V3.2 and GLM-5 checkpoints with MTP
layers appended (engine/devtools/testing/mtp_layers.py), float32, 4-token pages so drafts
and rollbacks cross pages. Random MTP layers draft badly (a few percent accepted),
which exercises rejection and rollback on nearly every step; the "copying"
checkpoints, whose MTP layer provably predicts the target's next token, show
drafts accepted in full, chained ones included.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.devtools.testing.checkpoints import build_deepseek_v3, build_glm4_moe
from engine.devtools.testing.mtp_layers import add_mtp_layers
from tests.engine.agreement import assert_outputs_agree
from tests.engine.dsa_checkpoints import build_deepseek_v32, build_glm_moe_dsa

FAMILIES = {
    "deepseek_v3": build_deepseek_v3,
    "glm4_moe": build_glm4_moe,
    "deepseek_v32": build_deepseek_v32,
    "glm_moe_dsa": build_glm_moe_dsa,
}
PROMPTS = [
    [5, 17, 42, 99, 3, 250, 7, 61],
    [12, 33, 5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 5, 17, 42, 99, 3, 250, 7],
    [200, 201, 9],
    list(range(30, 70)),
]
FLOAT32_LOGITS_TOL = 1e-4  # as tests/engine/test_speculative.py: summation order only


def engine(path, **settings) -> LLM:
    return LLM(str(path), dtype="float32", kv_cache_dtype="auto", page_size=4, **settings)


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **extra)


def counts(llm: LLM) -> tuple[int, int]:
    stats = llm.engine.speculator.stats()
    return stats["speculative_drafted_tokens"], stats["speculative_accepted_tokens"]


def assert_as_plain(got, plain) -> None:
    """Equal to plain decoding's (run with logprobs) up to a near-tie, if any."""
    for a, b in zip(got, plain, strict=True):
        assert_outputs_agree(a.outputs[0], b.outputs[0], FLOAT32_LOGITS_TOL)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "model"
    return request.param, add_mtp_layers(FAMILIES[request.param](folder), seed=1)


def test_outputs_equal_plain_decoding_batched_and_chunked(family):
    """A batch of several prompts, prefills chunked by a small token budget, one and two
    draft tokens: the tokens are plain decoding's, and drafts were proposed."""
    _, path = family
    plain = engine(path).generate(PROMPTS, greedy(24, logprobs=2))
    for tokens in (1, 2):
        llm = engine(
            path, speculative="mtp", speculative_mtp_tokens=tokens, max_num_batched_tokens=16
        )
        assert llm.engine.pool.layout.num_layers == llm.engine.model.config.num_layers + 1
        assert_as_plain(llm.generate(PROMPTS, greedy(24)), plain)
        drafted, accepted = counts(llm)
        assert drafted > 0 and 0 <= accepted <= drafted
        used = llm.engine.stats()["used_tokens"]
        assert used == 0  # every draft page given back


def test_a_request_may_opt_out(family):
    _, path = family
    llm = engine(path, speculative="mtp")
    plain = engine(path).generate(PROMPTS[:2], greedy(12, logprobs=2))
    got = llm.generate(PROMPTS[:2], greedy(12, speculative=False))
    assert_as_plain(got, plain)
    assert counts(llm) == (0, 0)


@pytest.mark.parametrize("name", ["deepseek_v3", "glm4_moe", "glm_moe_dsa"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_a_copying_mtp_layer_has_every_draft_accepted(name, tokens, tmp_path):
    path = add_mtp_layers(FAMILIES[name](tmp_path / "model"), copying=True)
    plain = engine(path).generate(PROMPTS, greedy(20, logprobs=2))
    llm = engine(path, speculative="mtp", speculative_mtp_tokens=tokens)
    assert_as_plain(llm.generate(PROMPTS, greedy(20)), plain)
    drafted, accepted = counts(llm)
    assert drafted > 0 and accepted == drafted
    # k accepted drafts per verification: the 20 tokens take about 20 / (k + 1) steps.
    steps = llm.engine.speculator.steps
    assert steps <= len(PROMPTS) * (-(-19 // (tokens + 1)) + 1)


def test_long_generation_with_rejected_drafts_stays_identical(family):
    """Rejected drafts' KV, target's and MTP layer's alike, never leaks into later steps."""
    _, path = family
    prompt = [PROMPTS[1]]
    plain = engine(path).generate(prompt, greedy(160, logprobs=2))
    llm = engine(path, speculative="mtp", speculative_mtp_tokens=2, max_num_batched_tokens=16)
    assert_as_plain(llm.generate(prompt, greedy(160)), plain)
    drafted, accepted = counts(llm)
    assert drafted - accepted > 10  # many rejections, each rolled back
    allocator = llm.engine.allocator
    cached = llm.engine.prefix_cache.num_pages
    assert allocator.num_free + cached == allocator.num_pages


def test_preemption_with_drafts_in_flight(family):
    """Six sequences in a pool that holds fewer: preempted ones recompute, their MTP KV
    included, and their stored drafts are not handed out stale."""
    _, path = family
    prompts = [[5 + i, 17, 42, 99, 3 + i, 250, 7, 61] for i in range(6)]
    plain = engine(path).generate(prompts, greedy(40, logprobs=2))
    roomy = engine(path, speculative="mtp")
    per_token = roomy.engine.pool.layout.bytes_per_token("float32")
    tight = engine(
        path, speculative="mtp", max_model_len=64, kv_memory=per_token * 4 * 24 / 1024**3
    )
    seqs = [tight.engine.add_request(p, greedy(40)) for p in prompts]
    while tight.engine.has_unfinished():
        tight.engine.step()
    assert sum(seq.num_preemptions for seq in seqs) > 0
    assert counts(tight)[0] > 0
    for seq, want in zip(seqs, plain, strict=True):
        assert seq.output_token_ids == want.outputs[0].token_ids or _agrees(seq, want)


def _agrees(seq, want) -> bool:
    from tests.engine.agreement import assert_greedy_agrees, margins_of_output

    margins = margins_of_output(want.outputs[0])
    assert_greedy_agrees(seq.output_token_ids, want.outputs[0].token_ids, margins, 1e-4)
    return True


def test_a_model_without_mtp_layers_is_refused(tmp_path):
    path = build_deepseek_v3(tmp_path / "model")
    with pytest.raises(Exception, match="no MTP layer tensors"):
        engine(path, speculative="mtp")
