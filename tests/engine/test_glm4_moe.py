"""Glm4MoeForCausalLM (GLM-4.5/4.6/4.7) against transformers, and MoE routing on its own.

Tolerances (float32 model and KV): logits within 1e-4 absolute of
transformers' (logits reach about +-3.5; measured differences are below
2e-6), greedy tokens equal over 16 steps. bfloat16 and FP8 KV bounds are in
tests.engine.moe_checkpoints.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import CheckpointError, UnsupportedModelError
from engine.kv.sizing import kv_bytes_per_token
from engine.layers.moe import SparseMoE
from engine.layers.moe_routing import RoutingConfig, route
from engine.model_files.model_config import parse_config
from engine.models.decoder import GatedMLP
from engine.models.glm4_moe import Glm4MoeForCausalLM
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.moe_checkpoints import (
    GLM4_MOE,
    assert_within_quantized_bounds,
    build_glm4_moe,
    copy_checkpoint,
    read_config,
    read_tensors,
    write_config,
)

FP32_ATOL = 1e-4
# From 2: reference_greedy treats token 0 as padding and masks it out.
PROMPT = torch.randint(2, 256, (40,), generator=torch.Generator().manual_seed(2)).tolist()

VARIANTS = {
    "qk_norm": {},
    # GLM-4.5-Air: no qk-norm.
    "no_qk_norm": {"use_qk_norm": False},
    "grouped_topk": {"n_group": 4, "topk_group": 2, "num_experts_per_tok": 3},
}


def make_llm(path, dtype="float32", kv="auto") -> LLM:
    return LLM(str(path), dtype=dtype, kv_cache_dtype=kv, kv_memory=0.01)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm4_moe")
    return {name: build_glm4_moe(root / name, **over) for name, over in VARIANTS.items()}


@pytest.fixture(scope="module")
def references(checkpoints):
    return {name: reference_logits(path, PROMPT) for name, path in checkpoints.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers_however_prefill_is_chunked(variant, checkpoints, references):
    llm = make_llm(checkpoints[variant])
    for chunk in (None, 5, 1):
        got = llm.prompt_logits(PROMPT, chunk_size=chunk)
        diff = (got - references[variant]).abs().max().item()
        assert diff < FP32_ATOL, f"{variant}, chunk {chunk}: max |diff| {diff}"


def test_greedy_tokens_match_transformers(checkpoints):
    path = checkpoints["qk_norm"]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    out = make_llm(path).generate([PROMPT[:12]], params)[0]
    assert assert_greedy_matches_reference(path, PROMPT[:12], out.outputs[0].token_ids, FP32_ATOL)


@pytest.mark.parametrize(
    "dtype, kv", [("float32", "fp8_e4m3"), ("bfloat16", "bf16"), ("bfloat16", "fp8_e4m3")]
)
def test_bf16_and_fp8_kv_within_bounds(dtype, kv, checkpoints, references):
    path = checkpoints["qk_norm"]
    got = make_llm(path, dtype=dtype, kv=kv).prompt_logits(PROMPT)
    if kv == "bf16":
        expected = reference_logits(path, PROMPT, dtype=torch.bfloat16)
    else:
        expected = references["qk_norm"]
    assert_within_quantized_bounds(got, expected, fp8=kv == "fp8_e4m3")


def test_router_stays_float32_under_bfloat16(checkpoints):
    model = make_llm(checkpoints["qk_norm"], dtype="bfloat16", kv="bf16").engine.model
    gate = model.model.layers[1].mlp.gate
    assert gate.weight.dtype == torch.float32
    assert gate.e_score_correction_bias.dtype == torch.float32
    assert model.model.layers[1].mlp.experts[0].down_proj.weight.dtype == torch.bfloat16


def test_mtp_layer_skipped_with_a_log_line(checkpoints, tmp_path, caplog):
    src = checkpoints["qk_norm"]
    tensors = read_tensors(src)
    for name, tensor in list(tensors.items()):
        if name.startswith("model.layers.1."):
            tensors["model.layers.2." + name[len("model.layers.1.") :]] = tensor.clone()
    tensors["model.layers.2.eh_proj.weight"] = torch.randn(64, 128)  # MTP-only modules
    path = copy_checkpoint(src, tmp_path / "with_mtp", tensors)
    assert read_config(path)["num_nextn_predict_layers"] == 1
    caplog.set_level(logging.INFO, logger="engine.weights.names")
    got = make_llm(path).prompt_logits(PROMPT[:8])
    assert "multi-token-prediction layer(s) 2" in caplog.text
    assert (got - reference_logits(src, PROMPT[:8])).abs().max().item() < FP32_ATOL


def test_missing_expert_tensor_is_named(checkpoints, tmp_path):
    src = checkpoints["qk_norm"]
    tensors = read_tensors(src)
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    path = copy_checkpoint(src, tmp_path / "missing", tensors)
    with pytest.raises(CheckpointError, match=r"experts\.5\.gate_up_proj\.weight:up"):
        make_llm(path)


def test_invalid_grouping_refused_at_load(checkpoints, tmp_path):
    src = checkpoints["qk_norm"]
    path = copy_checkpoint(src, tmp_path / "bad", read_tensors(src))
    config = read_config(path)
    config.update(n_group=3, topk_group=1)
    write_config(path, config)
    with pytest.raises(CheckpointError, match=r"n_routed_experts=8 is not divisible by n_group=3"):
        make_llm(path)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"n_group": 3}, r"not divisible by n_group=3"),
        ({"n_group": 2, "topk_group": 3}, r"topk_group=3 must be between 1 and n_group=2"),
        ({"n_group": 8, "topk_group": 2}, r"1 expert per group"),
        (
            {"n_group": 4, "topk_group": 1, "num_experts_per_tok": 3},
            r"topk_group=1 groups of 2 experts .* fewer than num_experts_per_tok=3",
        ),
        ({"num_experts_per_tok": 9}, r"num_experts_per_tok=9 must be between 1 and"),
    ],
)
def test_grouped_topk_validation(fields, message):
    with pytest.raises(CheckpointError, match=message):
        RoutingConfig.from_config({**GLM4_MOE, **fields})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"scoring_func": "relu"}, r"scoring_func='relu' is not supported"),
        ({"topk_method": "fancy"}, r"topk_method='fancy' is not supported"),
    ],
)
def test_unknown_routing_config_refused(fields, message):
    with pytest.raises(UnsupportedModelError, match=message):
        RoutingConfig.from_config({**GLM4_MOE, **fields})


def reference_route(logits, bias, routing: RoutingConfig):
    """Token by token, spelled out: the same decisions route() makes."""
    weights, ids = [], []
    for row in range(logits.shape[0]):
        scores = logits[row].sigmoid() if routing.scoring == "sigmoid" else logits[row].softmax(-1)
        choice = scores + bias if bias is not None else scores.clone()
        if routing.grouped:
            size = routing.experts_per_group
            ranked = []
            for g in range(routing.num_groups):
                members = sorted(choice[g * size : (g + 1) * size].tolist(), reverse=True)
                ranked.append(
                    (sum(members[:2]) if routing.group_ranking == "top2_sum" else members[0], g)
                )
            keep = {g for _, g in sorted(ranked, reverse=True)[: routing.top_groups]}
            for g in range(routing.num_groups):
                if g not in keep:
                    choice[g * size : (g + 1) * size] = float("-inf")
        order = sorted(range(len(choice)), key=lambda e: float(choice[e]), reverse=True)
        chosen = order[: routing.top_k]
        w = scores[chosen]
        if routing.normalize:
            w = w / w.sum()
        weights.append(w * routing.scaling)
        ids.append(chosen)
    return torch.stack(weights), torch.tensor(ids)


@pytest.mark.parametrize(
    "routing",
    [
        RoutingConfig(num_experts=16, top_k=4, num_groups=4, top_groups=2, scaling=2.5),
        RoutingConfig(num_experts=12, top_k=3, num_groups=1, normalize=False),
        RoutingConfig(
            num_experts=8,
            top_k=2,
            num_groups=4,
            top_groups=2,
            scoring="softmax",
            group_ranking="max",
            correction_bias=False,
        ),
    ],
)
def test_route_matches_a_token_by_token_reference(routing):
    torch.manual_seed(0)
    logits = torch.randn(20, routing.num_experts) * 2
    bias = torch.randn(routing.num_experts) * 0.3 if routing.correction_bias else None
    weights, ids = route(logits, routing, bias)
    ref_weights, ref_ids = reference_route(logits, bias, routing)
    for row in range(20):  # the set of experts matters, not the order topk returns them in
        got = dict(zip(ids[row].tolist(), weights[row].tolist(), strict=True))
        want = dict(zip(ref_ids[row].tolist(), ref_weights[row].tolist(), strict=True))
        assert got.keys() == want.keys()
        for expert, value in want.items():
            assert got[expert] == pytest.approx(value, rel=1e-5)


def test_expert_loop_equals_dense_mixture():
    torch.manual_seed(0)
    routing = RoutingConfig(num_experts=6, top_k=2, scaling=1.5)
    experts = [GatedMLP(16, 8) for _ in range(6)]
    moe = SparseMoE(16, routing, experts.__getitem__, shared_experts=GatedMLP(16, 8))
    with torch.no_grad():
        moe.gate.weight.normal_()
        x = torch.randn(11, 16)
        got = moe(x)
        weights, ids = moe.gate(x)
        dense = torch.stack([e(x) for e in experts], dim=1)  # [T, E, hidden]
        mix = torch.zeros(11, 6).scatter_(1, ids, weights)
        expected = (dense * mix[..., None]).sum(1) + moe.shared_experts(x)
    assert (got - expected).abs().max().item() < 1e-5


def test_glm46_kv_bytes_per_token_from_its_config():
    raw = dict(
        architectures=["Glm4MoeForCausalLM"],
        model_type="glm4_moe",
        hidden_size=5120,
        num_hidden_layers=92,
        num_attention_heads=96,
        num_key_value_heads=8,
        head_dim=128,
        partial_rotary_factor=0.5,
        rope_theta=1000000,
        max_position_embeddings=202752,
        n_routed_experts=160,
        num_experts_per_tok=8,
        n_group=1,
        topk_group=1,
        num_nextn_predict_layers=1,
        vocab_size=151552,
    )
    cfg = parse_config(raw)
    layout = Glm4MoeForCausalLM.kv_layout(SimpleNamespace(config=cfg))
    assert kv_bytes_per_token(layout, "fp8_e4m3") == 188_416
    assert kv_bytes_per_token(layout, "bf16") == 376_832
    RoutingConfig.from_config(raw)  # the real grouping is valid
