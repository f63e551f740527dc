"""GlmMoeDsaForCausalLM (GLM-5.x: MLA with DeepSeek sparse attention) against transformers.

The tiny checkpoint (tests/engine/dsa_checkpoints.py) attends to index_topk = 8
positions a query, so the 40-token prompt is sparse from its ninth position
on, in prefill and in decode; its layer 1 is "shared" (reuses layer 0's
selection). Tolerances as for DeepSeek V3 (float32 logits within 1e-4 of
transformers'; measured about 3e-6); the quantized runs are compared where
the selections agree (tests/engine/dsa_agreement.py).
"""

from __future__ import annotations

import pytest
import torch

import engine.attention.sparse_mla as sparse_mla
import engine.cpu_kernels.mla_decode as mla_kernel
import engine.models.dsa_indexer as dsa_indexer
from engine import LLM, SamplingParams
from engine.cpu_kernels.library import unavailable as cpu_kernels_unavailable
from engine.kv.sizing import kv_bytes_per_token
from engine.model_files.model_config import parse_config
from engine.models.dsa_config import indexer_settings
from tests.engine.agreement import assert_outputs_agree
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.dsa_agreement import (
    assert_within_bounds_where_selection_agrees,
    chunked_engine_run,
    engine_run,
    recorded_selections,
    reference_run,
)
from tests.engine.dsa_checkpoints import GLM_MOE_DSA, INDEX_TOPK, build_glm_moe_dsa

FP32_ATOL = 1e-4
PROMPT = torch.randint(2, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
SHORT = PROMPT[:5]  # with 3 generated tokens, never more than index_topk positions
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SPECULATION = dict(max_tokens=16, temperature=0, ignore_eos=True)


def make_llm(path, dtype="float32", kv="auto") -> LLM:
    return LLM(str(path), dtype=dtype, kv_cache_dtype=kv, kv_memory=0.01)


@pytest.fixture(scope="module")
def glm_path(tmp_path_factory):
    return build_glm_moe_dsa(tmp_path_factory.mktemp("glm_moe_dsa") / "tiny")


@pytest.fixture(scope="module")
def llm(glm_path):
    return make_llm(glm_path)


@pytest.fixture(scope="module")
def expected(glm_path):
    return reference_logits(glm_path, PROMPT)


def test_logits_match_transformers_however_prefill_is_chunked(llm, expected):
    # One chunk (masked prefill), chunks over a cached prefix, and token by token (decode).
    for chunk in (None, 5, 1):
        diff = (llm.prompt_logits(PROMPT, chunk_size=chunk) - expected).abs().max().item()
        assert diff < FP32_ATOL, f"chunk {chunk}: max |diff| {diff}"


def test_sparse_decode_runs_the_c_kernel_over_the_selected_positions(llm, expected, monkeypatch):
    if cpu_kernels_unavailable():
        pytest.skip("the C kernels are not built here")
    lengths = []
    original = mla_kernel.mla_decode

    def counting(q_nope, q_rope, kv_b, storage, slots, context_lengths, *rest):
        lengths.append(int(context_lengths.max()))
        return original(q_nope, q_rope, kv_b, storage, slots, context_lengths, *rest)

    monkeypatch.setattr(mla_kernel, "mla_decode", counting)
    got = llm.prompt_logits(PROMPT, chunk_size=1)
    assert (got - expected).abs().max().item() < FP32_ATOL
    # Every one-token step of all three layers; past position 8 each reads 8 rows.
    assert len(lengths) == 3 * len(PROMPT) and max(lengths) == INDEX_TOPK


def test_greedy_tokens_match_transformers(glm_path, llm):
    prompt = PROMPT[:12]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    assert assert_greedy_matches_reference(glm_path, prompt, out.outputs[0].token_ids, FP32_ATOL)


def test_context_within_topk_attends_densely(glm_path, llm):
    """No query sees more than index_topk positions: nothing is selected, the dense paths
    run, and the result is still transformers'."""
    with recorded_selections() as masks:
        logits = llm.prompt_logits(SHORT + [9, 10, 11], decode_last=3)
        out = llm.generate([SHORT], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert masks == []
    expected = reference_logits(glm_path, SHORT + [9, 10, 11])
    assert (logits - expected).abs().max().item() < FP32_ATOL
    assert_greedy_matches_reference(glm_path, SHORT, out[0].outputs[0].token_ids, FP32_ATOL)


def test_shared_layer_has_no_indexer_and_keeps_no_keys(llm):
    layers = llm.engine.model.model.layers
    assert [layer.self_attn.indexer is None for layer in layers] == [False, True, False]
    pool = llm.engine.pool
    assert pool.index_row == {0: 0, 2: 1}
    latent = GLM_MOE_DSA["kv_lora_rank"] + GLM_MOE_DSA["qk_rope_head_dim"]
    keys = 2 * GLM_MOE_DSA["index_head_dim"]  # layers 0 and 2
    assert kv_bytes_per_token(llm.engine.layout, "float32") == (3 * latent + keys) * 4
    # FP8 latent, BF16 indexer keys (engine/kv/dsa_pool.py says why).
    assert kv_bytes_per_token(llm.engine.layout, "fp8_e4m3") == 3 * latent + keys * 2


def test_absorbed_and_expanded_attention_agree_when_sparse(llm):
    model = llm.engine.model
    results = {}
    for path in ("absorbed", "expanded"):
        model.set_mla_path(path)
        results[path] = [llm.prompt_logits(PROMPT, chunk_size=c) for c in (None, 7)]
    model.set_mla_path("auto")
    for absorbed, expanded in zip(results["absorbed"], results["expanded"], strict=True):
        assert (absorbed - expanded).abs().max().item() < 1e-5


def test_batched_decode_of_short_and_long_sequences_matches_each_alone(llm):
    """One decode batch holding a sequence within index_topk and ones past it: each
    sequence's selection is its own, padding never selected."""
    prompts = [SHORT, PROMPT[:20], PROMPT[3:30]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)
    together = llm.generate(prompts, params)
    for prompt, out in zip(prompts, together, strict=True):
        alone = llm.generate([prompt], params)[0]
        assert_outputs_agree(out.outputs[0], alone.outputs[0], FP32_ATOL)


@pytest.mark.parametrize(
    "dtype, kv", [("float32", "fp8_e4m3"), ("bfloat16", "bf16"), ("bfloat16", "fp8_e4m3")]
)
def test_bf16_and_fp8_within_bounds_where_selection_agrees(dtype, kv, glm_path):
    reference_dtype = torch.bfloat16 if kv == "bf16" else torch.float32
    expected, expected_masks = reference_run(glm_path, PROMPT, reference_dtype)
    quantized = make_llm(glm_path, dtype=dtype, kv=kv)
    got, masks = engine_run(quantized, PROMPT)
    fp8 = kv == "fp8_e4m3"
    assert_within_bounds_where_selection_agrees(got, masks, expected, expected_masks, fp8, 8)
    # Chunking does not change what the cache holds, indexer keys included: where the
    # chunked prefill selects as the whole one did, the rows differ by rounding only (the
    # attention kernels sum in other blocks, which may move a BF16 score across top-k).
    chunked, chunked_masks = chunked_engine_run(quantized, PROMPT, 5, len(masks))
    assert_within_bounds_where_selection_agrees(chunked, chunked_masks, got, masks, fp8, 8)


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_prefix_cache_hit_gives_the_same_tokens(kv, glm_path, llm):
    engine = llm if kv == "auto" else make_llm(glm_path, kv=kv)
    cold = engine.generate([PROMPT], GREEDY)[0]
    warm = engine.generate([PROMPT], GREEDY)[0]
    assert warm.num_cached_tokens >= 32  # the prompt's two full 16-token pages
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"index_topk_freq": 2},
        {"index_topk_freq": 3, "index_skip_topk_offset": 1},
        {"index_topk_pattern": "FSSFSF"},
    ],
)
def test_indexer_types_derived_as_transformers_derives_them(fields):
    from transformers import GlmMoeDsaConfig

    config = GlmMoeDsaConfig(num_hidden_layers=6, **fields)
    raw = {**config.to_dict(), "architectures": ["GlmMoeDsaForCausalLM"], **fields}
    written = indexer_settings(parse_config(raw))
    del raw["indexer_types"]  # a config.json that leaves the list to the fields
    derived = indexer_settings(parse_config(raw))
    assert list(written.indexer_types) == list(derived.indexer_types) == config.indexer_types
    assert written.rope_interleaved and written.num_heads == 32 and written.topk == 2048


def test_selection_is_shared_with_the_layer_after(llm, monkeypatch):
    """Layer 1 attends with layer 0's selection: one selection per full layer is made."""
    calls = []
    original = dsa_indexer.select_top_k
    monkeypatch.setattr(dsa_indexer, "select_top_k", lambda *a: calls.append(1) or original(*a))
    llm.prompt_logits(PROMPT)
    assert len(calls) == 2


@pytest.mark.parametrize("as_rows", [True, False], ids=["rows", "extend"])
def test_prompt_lookup_speculation_gives_plain_decodings_tokens(glm_path, as_rows):
    """Verification attends over drafted tokens as one-query rows (the CPU default) or as
    one extend per sequence (a masked selection): the same tokens as plain decoding."""
    llm = LLM(str(glm_path), dtype="float32", kv_cache_dtype="auto", kv_memory=0.01, page_size=4)
    llm.engine.runner.verify_as_rows = as_rows
    repeated = PROMPT[:10] * 3 + PROMPT[:4]  # drafts to copy, long past index_topk
    prompts = [repeated, PROMPT[5:25] + PROMPT[5:12]]
    plain = llm.generate(prompts, SamplingParams(**SPECULATION, speculative=False, logprobs=2))
    drafted = llm.engine.speculator.stats()["speculative_drafted_tokens"]
    speculated = llm.generate(prompts, SamplingParams(**SPECULATION, speculative=True))
    assert llm.engine.speculator.stats()["speculative_drafted_tokens"] > drafted
    for got, want in zip(speculated, plain, strict=True):
        assert_outputs_agree(got.outputs[0], want.outputs[0], FP32_ATOL)


def test_scores_in_query_blocks_select_the_same(llm, expected, monkeypatch):
    """A long prefill scores its queries a block at a time (bounded memory): blocks of
    three queries give transformers' logits too."""
    monkeypatch.setattr(sparse_mla, "_SCORE_BLOCK_VALUES", 3 * GLM_MOE_DSA["index_n_heads"] * 40)
    assert (llm.prompt_logits(PROMPT) - expected).abs().max().item() < FP32_ATOL
