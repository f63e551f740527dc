"""The engine's own model code against transformers' on tiny random checkpoints."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.agreement import assert_outputs_agree
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits

# float32 weights, float32 KV: only summation order differs from transformers.
FP32_LOGIT_TOL = 1e-4
# bf16 activations: transformers in bf16 itself differs from float32 by this much.
BF16_LOGIT_TOL = 0.15
FP8_LOGIT_TOL = 0.3

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 301, 4, 76, 200, 9]
MODELS = ["tiny_llama_dir", "tiny_qwen2_dir", "tiny_glm4_dir"]


@pytest.mark.parametrize("model_fixture", MODELS)
def test_float32_logits_match_transformers(model_fixture, request):
    model_dir = request.getfixturevalue(model_fixture)
    reference = reference_logits(model_dir, PROMPT)
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="auto")
    ours = llm.prompt_logits(PROMPT)
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() < FP32_LOGIT_TOL


@pytest.mark.parametrize("model_fixture", MODELS)
def test_float32_greedy_tokens_match_transformers(model_fixture, request):
    model_dir = request.getfixturevalue(model_fixture)
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="auto")
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    out = llm.generate([PROMPT], params)[0]
    # Equal up to a close call that float32 summation order could decide either way
    # (tiny GLM-4's fourth token is one: a margin of 7e-5).
    assert assert_greedy_matches_reference(
        model_dir, PROMPT, out.outputs[0].token_ids, FP32_LOGIT_TOL
    )


@pytest.mark.parametrize("model_fixture", MODELS)
@pytest.mark.parametrize(
    "dtype,kv,tol",
    [("bfloat16", "bf16", BF16_LOGIT_TOL), ("bfloat16", "fp8_e4m3", FP8_LOGIT_TOL)],
)
def test_reduced_precision_within_bounds(model_fixture, dtype, kv, tol, request):
    model_dir = request.getfixturevalue(model_fixture)
    reference = reference_logits(model_dir, PROMPT)
    llm = LLM(str(model_dir), dtype=dtype, kv_cache_dtype=kv)
    ours = llm.prompt_logits(PROMPT)
    error = (ours - reference).abs().max().item()
    assert error < tol, f"{dtype}/{kv}: max logit error {error:.4f} >= {tol}"
    # And the ranking mostly survives: top-1 agreement with float32 transformers.
    agree = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert agree >= 0.8


def test_batched_generation_equals_one_at_a_time(tiny_llama_dir):
    """Several sequences of different lengths in one forward give each its own answer."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:14], [7]]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True)
    together = [o.outputs[0] for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].outputs[0] for p in prompts]
    # Another batch is another matrix shape, summed in another order (float32): equal
    # wherever that cannot decide (--deterministic makes it bit-identical: test_deterministic).
    for prompt, got, want in zip(prompts, together, alone, strict=True):
        assert assert_outputs_agree(got, want, FP32_LOGIT_TOL)
        assert_greedy_matches_reference(tiny_llama_dir, prompt, got.token_ids, FP32_LOGIT_TOL)


def test_string_prompts_and_text(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto")
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    out = llm.generate("def add(a, b):", params)[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("def add(a, b):")
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids)


def test_checkpoint_kv_scales_are_used(tmp_path):
    """k_scale/v_scale tensors in the checkpoint become the pool's scales."""
    from safetensors.torch import load_file, save_file

    from tests.engine.checkpoints import tiny_llama

    model_dir = tiny_llama(tmp_path / "m")
    files = sorted(model_dir.glob("*.safetensors"))
    tensors = load_file(str(files[0]))
    for layer in range(2):
        tensors[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(0.01 * (layer + 1))
        tensors[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.02 * (layer + 1))
    save_file(tensors, str(files[0]), metadata={"format": "pt"})
    llm = LLM(str(model_dir), dtype="float32", kv_cache_dtype="fp8_e4m3")
    pool = llm.engine.pool
    assert pool.scale_source == "checkpoint"
    assert pool.k_scale.tolist() == pytest.approx([0.01, 0.02])
    assert pool.v_scale.tolist() == pytest.approx([0.02, 0.04])
