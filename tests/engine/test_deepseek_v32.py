"""DeepseekV32ForCausalLM (DeepSeek V3.2: MLA with DeepSeek sparse attention) against transformers.

The tiny checkpoint (tests/engine/dsa_checkpoints.py) has an indexer in each of
its three layers, YaRN rope and index_topk = 8, so the 40-token prompt is
sparse from its ninth position on. The indexer's rope is half-split here
(interleaved in GLM-5). Tolerances as in tests/engine/test_glm_moe_dsa.py.
"""

from __future__ import annotations

import logging

import pytest
import torch

from engine import LLM, SamplingParams
from engine.kv.sizing import kv_bytes_per_token
from engine.model_files.model_config import parse_config
from engine.models.deepseek_v32 import DeepseekV32ForCausalLM
from engine.planner.capacity import kv_layout_for
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.dsa_agreement import (
    assert_within_bounds_where_selection_agrees,
    engine_run,
    reference_run,
)
from tests.engine.dsa_checkpoints import INDEX_TOPK, build_deepseek_v32
from tests.engine.moe_checkpoints import copy_checkpoint, read_config, read_tensors, write_config

FP32_ATOL = 1e-4
PROMPT = torch.randint(2, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()


def make_llm(path, dtype="float32", kv="auto") -> LLM:
    return LLM(str(path), dtype=dtype, kv_cache_dtype=kv, kv_memory=0.01)


@pytest.fixture(scope="module")
def v32_path(tmp_path_factory):
    return build_deepseek_v32(tmp_path_factory.mktemp("deepseek_v32") / "tiny")


@pytest.fixture(scope="module")
def llm(v32_path):
    return make_llm(v32_path)


@pytest.fixture(scope="module")
def expected(v32_path):
    return reference_logits(v32_path, PROMPT)


def test_logits_match_transformers_however_prefill_is_chunked(llm, expected):
    for chunk in (None, 5, 1):
        diff = (llm.prompt_logits(PROMPT, chunk_size=chunk) - expected).abs().max().item()
        assert diff < FP32_ATOL, f"chunk {chunk}: max |diff| {diff}"


def test_greedy_tokens_match_transformers(v32_path, llm):
    prompt = PROMPT[:12]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    assert assert_greedy_matches_reference(v32_path, prompt, out.outputs[0].token_ids, FP32_ATOL)


def test_every_layer_runs_its_own_indexer_with_half_split_rope(llm):
    layers = llm.engine.model.model.layers
    assert all(layer.self_attn.indexer is not None for layer in layers)
    assert not layers[0].self_attn.indexer.rotary.interleaved
    assert layers[0].self_attn.rotary.interleaved  # MLA's own rope stays interleaved


@pytest.mark.parametrize("dtype, kv", [("float32", "fp8_e4m3"), ("bfloat16", "bf16")])
def test_bf16_and_fp8_within_bounds_where_selection_agrees(dtype, kv, v32_path):
    reference_dtype = torch.bfloat16 if kv == "bf16" else torch.float32
    expected, expected_masks = reference_run(v32_path, PROMPT, reference_dtype)
    got, masks = engine_run(make_llm(v32_path, dtype=dtype, kv=kv), PROMPT)
    fp8 = kv == "fp8_e4m3"
    assert_within_bounds_where_selection_agrees(
        got, masks, expected, expected_masks, fp8, INDEX_TOPK
    )


def test_mtp_layer_skipped_at_load(v32_path, expected, tmp_path, caplog):
    """The checkpoint's MTP layer (index num_hidden_layers) is left out with a log line."""
    tensors = read_tensors(v32_path)
    for name, tensor in list(tensors.items()):
        if name.startswith("model.layers.2."):
            tensors["model.layers.3." + name[len("model.layers.2.") :]] = tensor.clone()
    path = copy_checkpoint(v32_path, tmp_path / "with_mtp", tensors)
    write_config(path, {**read_config(path), "num_nextn_predict_layers": 1})
    caplog.set_level(logging.INFO, logger="engine.weights.names")
    got = make_llm(path).prompt_logits(PROMPT)
    assert "multi-token-prediction layer(s) 3" in caplog.text
    assert (got - expected).abs().max().item() < FP32_ATOL


def _released(architecture: str) -> dict:
    """The attention shape of DeepSeek V3.2's and GLM-5's released config.json."""
    common = dict(
        architectures=[architecture],
        vocab_size=129280,
        hidden_size=7168,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_attention_heads=128,
        index_topk=2048,
        index_head_dim=128,
        index_n_heads=64,
        num_nextn_predict_layers=1,
    )
    if architecture == "DeepseekV32ForCausalLM":
        return {**common, "model_type": "deepseek_v32", "num_hidden_layers": 61}
    return {**common, "model_type": "glm_moe_dsa", "num_hidden_layers": 78, "index_n_heads": 32}


@pytest.mark.parametrize(
    "architecture, fp8_bytes, bf16_bytes",
    [
        # 61 x 576 latent values + 61 x 128 indexer keys (BF16 in both)
        ("DeepseekV32ForCausalLM", 61 * 576 + 61 * 128 * 2, 61 * 576 * 2 + 61 * 128 * 2),
        ("GlmMoeDsaForCausalLM", 78 * 576 + 78 * 128 * 2, 78 * 576 * 2 + 78 * 128 * 2),
    ],
)
def test_kv_bytes_per_token_of_released_shapes(architecture, fp8_bytes, bf16_bytes):
    cfg = parse_config(_released(architecture))
    layout = DeepseekV32ForCausalLM.kv_layout(type("Model", (), {"config": cfg})())
    assert kv_layout_for(cfg) == layout  # the planner counts what the engine allocates
    assert kv_bytes_per_token(layout, "fp8_e4m3") == fp8_bytes
    assert kv_bytes_per_token(layout, "bf16") == bf16_bytes
    assert kv_bytes_per_token(layout, "fp8_e4m3", tp=8) == fp8_bytes  # replicated, as MLA's
    # A config without `architectures` is read by its model_type.
    raw = _released(architecture)
    del raw["architectures"]
    assert parse_config(raw).architecture == architecture
