"""DeepseekV3ForCausalLM (Kimi K2.x) against transformers on tiny random checkpoints.

Tolerances (float32 model and KV): logits within 1e-4 absolute of
transformers' (logits here reach about +-5; measured differences are around
1e-6), greedy tokens equal over 16 steps. Looser bounds for bfloat16 weights
and FP8 KV are stated at their tests.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from engine import LLM, SamplingParams
from engine.kv.sizing import kv_bytes_per_token
from engine.model_files.model_config import parse_config
from engine.models.deepseek_v3 import DeepseekV3ForCausalLM
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.moe_checkpoints import (
    DEEPSEEK_V3,
    as_kimi_k2,
    as_kimi_k25,
    assert_within_quantized_bounds,
    build_deepseek_v3,
    copy_checkpoint,
    read_tensors,
)

FP32_ATOL = 1e-4
# From 2: reference_greedy treats token 0 as padding and masks it out.
PROMPT = torch.randint(2, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()

VARIANTS = {
    "q_lora": {},
    "no_q_lora_with_bias": {"q_lora_rank": None, "attention_bias": True},
    "grouped_neox_rope": {
        "n_group": 4,
        "topk_group": 2,
        "rope_interleave": False,
        "attention_bias": True,
    },
}


def make_llm(path, dtype="float32", kv="auto") -> LLM:
    return LLM(str(path), dtype=dtype, kv_cache_dtype=kv, kv_memory=0.01)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (folder the engine loads, folder transformers loads as the reference)."""
    root = tmp_path_factory.mktemp("deepseek_v3")
    made = {}
    for name, overrides in VARIANTS.items():
        path = build_deepseek_v3(root / name, **overrides)
        made[name] = (path, path)
    base = made["q_lora"][0]
    made["kimi_k2_config"] = (as_kimi_k2(base, root / "kimi_k2"), base)
    made["kimi_k25_nested"] = (as_kimi_k25(base, root / "kimi_k25"), base)
    return made


@pytest.fixture(scope="module")
def references(checkpoints):
    return {name: reference_logits(ref, PROMPT) for name, (_, ref) in checkpoints.items()}


@pytest.mark.parametrize("variant", list(VARIANTS) + ["kimi_k2_config", "kimi_k25_nested"])
def test_logits_match_transformers_however_prefill_is_chunked(variant, checkpoints, references):
    llm = make_llm(checkpoints[variant][0])
    expected = references[variant]
    for chunk in (None, 5, 1):  # one chunk (expanded MLA), chunks, token by token (absorbed)
        got = llm.prompt_logits(PROMPT, chunk_size=chunk)
        assert got.shape == expected.shape
        diff = (got - expected).abs().max().item()
        assert diff < FP32_ATOL, f"{variant}, chunk {chunk}: max |diff| {diff}"


@pytest.mark.parametrize("variant", ["q_lora", "no_q_lora_with_bias"])
def test_greedy_tokens_match_transformers(variant, checkpoints):
    path = checkpoints[variant][0]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    out = make_llm(path).generate([PROMPT[:12]], params)[0]
    assert assert_greedy_matches_reference(path, PROMPT[:12], out.outputs[0].token_ids, FP32_ATOL)


def test_absorbed_and_expanded_attention_agree(checkpoints):
    llm = make_llm(checkpoints["q_lora"][0])
    model = llm.engine.model
    results = {}
    for path in ("absorbed", "expanded"):
        model.set_mla_path(path)
        results[path] = [llm.prompt_logits(PROMPT, chunk_size=c) for c in (None, 7)]
    model.set_mla_path("auto")
    for absorbed, expanded in zip(results["absorbed"], results["expanded"], strict=True):
        assert (absorbed - expanded).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "dtype, kv",
    [("float32", "fp8_e4m3"), ("bfloat16", "bf16"), ("bfloat16", "fp8_e4m3")],
)
def test_bf16_and_fp8_latent_cache_within_bounds(dtype, kv, checkpoints, references):
    """Bounds: see tests.engine.moe_checkpoints.assert_within_quantized_bounds."""
    path = checkpoints["q_lora"][0]
    llm = make_llm(path, dtype=dtype, kv=kv)
    got = llm.prompt_logits(PROMPT)
    if kv == "bf16":
        # bfloat16 weights: compare with transformers in bfloat16 (same rounded weights).
        expected = reference_logits(path, PROMPT, dtype=torch.bfloat16)
    else:
        expected = references["q_lora"]
    assert_within_quantized_bounds(got, expected, fp8=kv == "fp8_e4m3")
    # Chunking must not change what the cache holds: the same stored values either way.
    chunked = llm.prompt_logits(PROMPT, chunk_size=5)
    assert (chunked - got).abs().mean().item() < 1e-2
    if kv == "fp8_e4m3":
        scales = llm.engine.pool.scales()
        assert set(scales) == {"latent", "rope"}
        assert scales["latent"] != scales["rope"]  # each part calibrated on its own range


def test_mla_cache_layout_and_bytes(checkpoints):
    llm = make_llm(checkpoints["q_lora"][0])
    layout = llm.engine.layout
    assert layout.kind == "mla"
    assert layout.latent_dim == DEEPSEEK_V3["kv_lora_rank"] + DEEPSEEK_V3["qk_rope_head_dim"]
    assert kv_bytes_per_token(layout, "float32") == 2 * 24 * 4


def kimi_k26_config() -> dict:
    """Kimi K2.6's config.json shape: a kimi_k25 wrapper around a kimi_k2 text model."""
    text = dict(
        model_type="kimi_k2",
        architectures=["DeepseekV3ForCausalLM"],
        vocab_size=163840,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=64,
        num_key_value_heads=64,
        n_shared_experts=1,
        n_routed_experts=384,
        num_experts_per_tok=8,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        routed_scaling_factor=2.827,
        norm_topk_prob=True,
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        num_nextn_predict_layers=0,
        max_position_embeddings=262144,
        rope_theta=50000.0,
        rope_scaling={
            "type": "yarn",
            "factor": 64.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {"patch_size": 14},
        "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized"},
    }


def test_kimi_k26_kv_bytes_per_token_from_its_config():
    cfg = parse_config(kimi_k26_config())
    assert cfg.architecture == "DeepseekV3ForCausalLM"
    assert cfg.wrapper_model_type == "kimi_k25"
    assert cfg.rope["rope_type"] == "yarn" and cfg.rope["factor"] == 64.0
    assert cfg.quantization["quant_method"] == "compressed-tensors"
    layout = DeepseekV3ForCausalLM.kv_layout(SimpleNamespace(config=cfg))
    assert layout.latent_dim == 576
    assert kv_bytes_per_token(layout, "fp8_e4m3") == 35_136
    assert kv_bytes_per_token(layout, "bf16") == 70_272
    # The latent is replicated on every tensor-parallel rank.
    assert kv_bytes_per_token(layout, "fp8_e4m3", tp=8) == 35_136


def test_text_config_without_architectures_is_read_as_deepseek_v3():
    raw = kimi_k26_config()
    del raw["text_config"]["architectures"]
    assert parse_config(raw).architecture == "DeepseekV3ForCausalLM"


def test_mtp_layer_and_vision_tower_skipped_with_log_lines(checkpoints, tmp_path, caplog):
    nested = checkpoints["kimi_k25_nested"][0]
    tensors = read_tensors(nested)
    # The MTP layer a DeepSeek V3 checkpoint appends after its last layer.
    for name, tensor in list(tensors.items()):
        prefix = "language_model.model.layers.1."
        if name.startswith(prefix):
            tensors["language_model.model.layers.2." + name[len(prefix) :]] = tensor.clone()
    path = copy_checkpoint(nested, tmp_path / "with_mtp", tensors)
    caplog.set_level(logging.INFO, logger="engine.weights.names")
    llm = make_llm(path)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "multi-token-prediction layer(s) 2" in messages
    assert "vision tower" in messages and "image input is not supported" in messages
    got = llm.prompt_logits(PROMPT[:10])
    expected = reference_logits(checkpoints["q_lora"][1], PROMPT[:10])
    assert (got - expected).abs().max().item() < FP32_ATOL


@pytest.mark.parametrize(
    "rope",
    [
        # Kimi K2 (and the tiny checkpoints' shape of it)
        {
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 1.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        # DeepSeek V3: default betas; mscale != mscale_all_dim scales cos/sin too
        {
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
        },
        {"factor": 8.0, "original_max_position_embeddings": 2048, "truncate": False},
    ],
)
def test_yarn_frequencies_and_softmax_scale_match_transformers(rope):
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

    from engine.layers.yarn import yarn_inv_freq
    from engine.models.deepseek_v3 import MLAAttention, mla_rotary

    params = {"rope_type": "yarn", "rope_theta": 50000.0, **rope}
    overrides = {"qk_rope_head_dim": 64, "max_position_embeddings": 8192, "rope_parameters": params}
    config = DeepseekV3Config(**{**DEEPSEEK_V3, **overrides})
    expected_inv_freq, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    cfg = parse_config({**config.to_dict(), "architectures": ["DeepseekV3ForCausalLM"]})
    inv_freq, factor = yarn_inv_freq(64, cfg.rope, cfg.max_position_embeddings)
    assert torch.equal(inv_freq, expected_inv_freq.float())
    assert factor == pytest.approx(expected_factor, rel=1e-12)
    ours = MLAAttention(cfg, 0, mla_rotary(cfg))
    assert ours.scale == pytest.approx(DeepseekV3Attention(config, 0).scaling, rel=1e-12)


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_prefix_cache_hit_on_latent_pages_gives_the_same_tokens(kv, checkpoints):
    llm = make_llm(checkpoints["q_lora"][0], kv=kv)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    cold = llm.generate([PROMPT], params)[0]
    warm = llm.generate([PROMPT], params)[0]
    assert warm.num_cached_tokens >= 32  # the prompt's two full 16-token pages
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
