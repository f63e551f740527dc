"""KimiLinearForCausalLM (KDA + MLA + MoE) against transformers on tiny random checkpoints.

Tolerances (float32 model and KV): logits within 1e-4 absolute of
transformers' (logits here reach about +-4; measured differences are up to
about 2e-5, growing along the sequence as the recurrent state sums float32
roundings), greedy tokens equal over 16 steps up to the reference's first
close call (tests/engine/agreement.py). The prompt spans three of the chunked
form's 64-token chunks. Bounds for bfloat16 weights and FP8 KV are stated at
their test.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import KVCapacityError
from engine.kv.sizing import kv_bytes_per_token
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.kimi_linear_checkpoints import KIMI_LINEAR, as_released_config, build_kimi_linear
from tests.engine.moe_checkpoints import assert_within_quantized_bounds

FP32_ATOL = 1e-4
# From 2: reference_greedy treats token 0 as padding and masks it out.
PROMPT = torch.randint(2, 256, (150,), generator=torch.Generator().manual_seed(1)).tolist()
GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)

VARIANTS = {"base": {}, "q_lora_with_bias": {"q_lora_rank": 32, "attention_bias": True}}


def make_llm(path, dtype="float32", kv="auto", **kwargs) -> LLM:
    return LLM(str(path), dtype=dtype, kv_cache_dtype=kv, kv_memory=0.01, **kwargs)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (folder the engine loads, folder transformers loads as the reference)."""
    root = tmp_path_factory.mktemp("kimi_linear")
    made = {name: build_kimi_linear(root / name, **extra) for name, extra in VARIANTS.items()}
    made = {name: (path, path) for name, path in made.items()}
    released = as_released_config(build_kimi_linear(root / "released"))
    made["released_config"] = (released, released)
    return made


@pytest.fixture(scope="module")
def references(checkpoints):
    return {name: reference_logits(ref, PROMPT) for name, (_, ref) in checkpoints.items()}


@pytest.fixture(scope="module")
def base_llm(checkpoints):
    return make_llm(checkpoints["base"][0])


@pytest.mark.parametrize("variant", [*VARIANTS, "released_config"])
def test_logits_match_transformers_however_prefill_is_chunked(variant, checkpoints, references):
    llm = make_llm(checkpoints[variant][0])
    expected = references[variant]
    # One step (the chunked form over three chunks), pieces that cut across its chunks
    # (state and conv state carried between steps), token by token (the recurrence).
    for chunk in (None, 50, 1):
        got = llm.prompt_logits(PROMPT, chunk_size=chunk)
        assert got.shape == expected.shape
        diff = (got - expected).abs().max().item()
        assert diff < FP32_ATOL, f"{variant}, chunk {chunk}: max |diff| {diff}"


def test_greedy_tokens_match_transformers(checkpoints, base_llm):
    path = checkpoints["base"][0]
    out = base_llm.generate([PROMPT[:70]], GREEDY)[0].outputs[0].token_ids
    assert assert_greedy_matches_reference(path, PROMPT[:70], out, FP32_ATOL) > 0


def test_a_batch_keeps_each_sequences_state_apart(checkpoints):
    """Prompts of different lengths together, with a small token budget so long prompts
    prefill in pieces beside others' decode steps: each continues as it does alone in
    transformers."""
    path = checkpoints["base"][0]
    prompts = [PROMPT[:5], PROMPT[10:140], PROMPT[40:73], PROMPT[3:4]]
    llm = make_llm(path, max_num_batched_tokens=48)
    outs = llm.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs, strict=True):
        assert_greedy_matches_reference(path, prompt, out.outputs[0].token_ids, FP32_ATOL)


def test_preempted_sequences_recompute_from_a_fresh_state(checkpoints, base_llm):
    """A pool too small for all three sequences preempts one; its recompute starts from a
    zeroed slot (one that another sequence may have used meanwhile) and ends as alone."""
    path = checkpoints["base"][0]
    prompts = [PROMPT[:40], PROMPT[50:90], PROMPT[100:140]]
    alone = [base_llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]
    layout = base_llm.engine.layout
    page_tokens = 96  # room for about one and a half of the three 56-token sequences
    state_bytes = base_llm.engine.parts.rank.state_pool.nbytes // 64 * 4
    kv_gib = (state_bytes + page_tokens * kv_bytes_per_token(layout, "float32")) / 1024**3
    llm = LLM(
        str(path),
        dtype="float32",
        kv_cache_dtype="auto",
        kv_memory=kv_gib,
        max_num_seqs=4,
        max_model_len=64,
    )
    seqs = [llm.engine.add_request(p, GREEDY) for p in prompts]
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert sum(seq.num_preemptions for seq in seqs) > 0
    assert [seq.output_token_ids for seq in seqs] == alone
    assert llm.engine.scheduler.state_slots.num_free == 4  # every slot came back


@pytest.mark.parametrize(
    "dtype, kv",
    [("float32", "fp8_e4m3"), ("bfloat16", "bf16"), ("bfloat16", "fp8_e4m3")],
)
def test_bf16_weights_and_fp8_latent_cache_within_bounds(dtype, kv, checkpoints, references):
    """Bounds: tests.engine.moe_checkpoints.assert_within_quantized_bounds (mean and p90 of
    |diff| against transformers, float32, or bfloat16 for bfloat16 weights and KV)."""
    path = checkpoints["base"][0]
    llm = make_llm(path, dtype=dtype, kv=kv)
    got = llm.prompt_logits(PROMPT)
    if kv == "bf16":
        expected = reference_logits(path, PROMPT, dtype=torch.bfloat16)
    else:
        expected = references["base"]
    assert_within_quantized_bounds(got, expected, fp8=kv == "fp8_e4m3")
    # Chunking changes neither what the cache holds nor the state it carries.
    chunked = llm.prompt_logits(PROMPT, chunk_size=50)
    assert (chunked - got).abs().mean().item() < 1e-2


def test_only_the_mla_layers_keep_kv(base_llm):
    layout = base_llm.engine.layout
    assert layout.kind == "mla" and layout.num_layers == 2  # of four layers
    assert layout.latent_dim == KIMI_LINEAR["kv_lora_rank"] + KIMI_LINEAR["qk_rope_head_dim"]
    states = base_llm.engine.parts.rank.state_pool
    heads, dim = KIMI_LINEAR["linear_num_heads"], KIMI_LINEAR["linear_head_dim"]
    assert states.recurrent.shape == (2, 64, heads, dim, dim)  # per KDA layer and slot
    assert states.conv.shape == (2, 64, 3, 3 * heads * dim)


def test_the_states_come_out_of_the_kv_budget(checkpoints, base_llm):
    stats = base_llm.engine.stats()
    assert stats["recurrent_state_bytes"] == 64 * 12_800  # 64 slots of 2 KDA layers
    state_gib = stats["recurrent_state_bytes"] / 1024**3
    with pytest.raises(KVCapacityError, match="recurrent states"):
        LLM(str(checkpoints["base"][0]), dtype="float32", kv_memory=state_gib)
