"""`resident plan` for GLM-5.x (MLA + DSA indexer keys) and the Kimi hybrids (Kimi Linear, Kimi K3).

Every expected figure is computed here from the published shapes, not read back
from the planner: a DSA token costs one MLA latent row (kv_lora_rank +
qk_rope_head_dim) per layer plus one BF16 indexer key (index_head_dim) per layer
that runs an indexer; a hybrid token costs latent rows for its MLA layers only,
and each request holds a fixed KDA state (per KDA layer: heads x head_dim^2
float32 delta-rule state and the q/k/v short-convolution state, width - 1 BF16
inputs of 3 x heads x head_dim channels).
"""

from __future__ import annotations

import json

import pytest

from engine.errors import UnsupportedModelError
from engine.model_files.kimi_k3 import unrun_parts
from engine.model_files.model_config import parse_config
from engine.planner.capacity import PlanInputs, plan
from engine.planner.presets import PRESETS
from engine.planner.weight_bytes import scheme_from_config, weight_groups

GIB = 2**30
H200 = 143771 * 2**20
BUDGET_WITHOUT_WEIGHTS = H200 * 9 // 10 - 10 * GIB  # memory fraction 0.9, 10 GiB reserve
PAGE = 16
BYTES = {"bf16": 2, "fp8_e4m3": 1}
LATENT = 512 + 64  # kv_lora_rank + qk_rope_head_dim, GLM-5.x and the Kimi family alike


def tokens(weights_per_gpu: int, per_token: int) -> int:
    budget = BUDGET_WITHOUT_WEIGHTS - weights_per_gpu
    return max(budget, 0) // (per_token * PAGE) * PAGE


def kda_state(layers: int, heads: int, dim: int = 128, conv: int = 4) -> int:
    return layers * (heads * dim * dim * 4 + 3 * heads * dim * (conv - 1) * 2)


def dsa_bytes(layers: int, index_layers: int, dtype: str) -> int:
    return layers * LATENT * BYTES[dtype] + index_layers * 128 * 2


# GLM-5.2's indexer_types as the checkpoint lists them: full at 0-2, then every 4th.
GLM52_FULL = [0, 1, 2, *range(6, 78, 4)]


@pytest.mark.parametrize(("name", "index_layers"), [("glm-5.2", len(GLM52_FULL)), ("glm-5.1", 78)])
def test_glm5_kv_bytes_hold_the_latent_and_the_indexer_keys(name, index_layers):
    r = plan(name)
    assert r["kv_layout"] == {
        "kind": "mla",
        "layers": 78,
        "latent_dim": LATENT,
        "index_layers": index_layers,
        "index_dim": 128,
    }
    for dtype in BYTES:
        per_token = dsa_bytes(78, index_layers, dtype)
        assert r["kv_bytes_per_token"][dtype] == per_token
        assert r["kv_bytes_per_token_per_gpu"][dtype] == per_token  # replicated over TP
        assert r["capacity_tokens"][dtype] == tokens(r["weights"]["per_gpu_bytes"], per_token)


def test_glm52_on_8xh200_bf16_against_fp8():
    r = plan("glm-5.2", PlanInputs(gpu="h200", num_gpus=8))
    assert len(GLM52_FULL) == 21
    assert r["kv_bytes_per_token"] == {"bf16": 95_232, "fp8_e4m3": 50_304}
    assert r["weights"]["format"] == "fp8" and r["context_tokens"] == 1_048_576
    # About 754B parameters, as Z.ai publishes; FP8 leaves room for KV on 8 H200s.
    assert 745e9 < r["weights"]["params"] < 760e9
    cap = r["capacity_tokens"]
    assert 0 < cap["bf16"] < cap["fp8_e4m3"]
    assert r["fp8_over_bf16"] == pytest.approx(cap["fp8_e4m3"] / cap["bf16"], abs=1e-4)
    assert r["fp8_over_bf16"] == pytest.approx(95_232 / 50_304, abs=0.002)


def test_kimi_linear_48b_keeps_kv_for_its_mla_layers_only():
    r = plan("kimi-linear-48b", PlanInputs(gpu="h200", num_gpus=8))
    assert r["kv_layout"] == {"kind": "mla", "layers": 7, "latent_dim": LATENT}
    assert kda_state(layers=20, heads=32) == 43_417_600  # one request's whole state
    state = kda_state(layers=20, heads=32 // 8)  # KDA's heads split over the 8 ranks
    assert r["recurrent_state_bytes_per_request"] == state
    for dtype in BYTES:
        per_token = 7 * LATENT * BYTES[dtype]
        assert r["kv_bytes_per_token"][dtype] == per_token
        assert r["capacity_tokens"][dtype] == tokens(r["weights"]["per_gpu_bytes"], per_token)
        budget = BUDGET_WITHOUT_WEIGHTS - r["weights"]["per_gpu_bytes"]
        assert r["concurrent_requests"][dtype] == budget // (1_048_576 * per_token + state)
    assert 47e9 < r["weights"]["params"] < 50e9  # "48B"


def test_kimi_k3_layer_plan_and_state():
    r = plan("kimi-k3", PlanInputs(gpu="h200", num_gpus=8))
    assert r["kv_layout"] == {"kind": "mla", "layers": 24, "latent_dim": LATENT}
    assert r["kv_bytes_per_token"] == {"bf16": 24 * LATENT * 2, "fp8_e4m3": 24 * LATENT}
    assert r["recurrent_state_bytes_per_request"] == kda_state(layers=69, heads=96 // 8)
    assert r["weights"]["format"] == "mxfp4"
    assert 2.7e12 < r["weights"]["params"] < 2.9e12  # the published 2.8T


def test_kimi_k3_does_not_fit_8xh200_and_fits_16():
    eight = plan("kimi-k3", PlanInputs(gpu="h200", num_gpus=8))
    assert eight["capacity_tokens"] == {"bf16": 0, "fp8_e4m3": 0}
    assert any("leave no memory for KV" in w for w in eight["warnings"])
    sixteen = plan("kimi-k3", PlanInputs(gpu="h200", num_gpus=16))
    weights = sixteen["weights"]["per_gpu_bytes"]
    for dtype in BYTES:
        per_token = 24 * LATENT * BYTES[dtype]
        assert sixteen["capacity_tokens"][dtype] == tokens(weights, per_token) > 0


def test_kimi_k3_experts_cost_what_the_released_mxfp4_tensors_do():
    cfg = parse_config(PRESETS["kimi-k3"].config)
    scheme = scheme_from_config(cfg)
    groups = {g.name: g for g in weight_groups(cfg)}
    # Released tensors per expert (92 MoE layers x 896 experts): w1 and w3 packed
    # [3072, 1792] uint8 with scales [3072, 112]; w2 packed [3584, 1536], scales [3584, 96].
    experts = 92 * 896
    expected = experts * (2 * (3072 * 1792 + 3072 * 112) + (3584 * 1536 + 3584 * 96))
    got = sum(scheme.group_bytes(groups[n], True) for n in ("experts.gate+up", "experts.down"))
    assert got == expected
    assert groups["routed_expert_down_proj"].rows == 3584  # [3584, 7168] in BF16


def k3_config_dir(tmp_path, **text_overrides):
    """A folder with Kimi K3's config.json, real field names, the text model under text_config."""
    text = json.loads(json.dumps(PRESETS["kimi-k3"].config["text_config"]))
    text.update(text_overrides)
    config = {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "media_placeholder_token_id": 163605,
        "text_config": dict(
            text, quantization_config=PRESETS["kimi-k3"].config["quantization_config"]
        ),
        "vision_config": {"vt_num_hidden_layers": 27, "text_hidden_size": 7168},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_plan_reads_kimi_k3_from_its_config_json(tmp_path):
    folder = k3_config_dir(tmp_path)
    from_folder = plan(str(folder), PlanInputs(gpu="h200", num_gpus=16))
    preset = plan("kimi-k3", PlanInputs(gpu="h200", num_gpus=16))
    assert from_folder["source"] == "folder"
    for key in (
        "kv_layout",
        "kv_bytes_per_token",
        "capacity_tokens",
        "recurrent_state_bytes_per_request",
    ):
        assert from_folder[key] == preset[key], key
    assert from_folder["weights"]["format"] == "mxfp4"


EXPECTED_PARTS = (
    "attention residuals",
    "MLA output gate",
    "SiTU",
    "latent MoE",
    "full-rank output gate",
    "gate lower bound",
    "MXFP4",
)


def test_kimi_k3_parts_are_named_from_the_config():
    cfg = parse_config(PRESETS["kimi-k3"].config)
    parts = "; ".join(unrun_parts(cfg))
    for part in EXPECTED_PARTS:
        assert part in parts
    assert "rotary" not in parts  # K3's MLA is NoPE, which Kimi Linear runs
    assert unrun_parts(parse_config(PRESETS["kimi-linear-48b"].config)) == []
    rotary = parse_config(dict(PRESETS["kimi-linear-48b"].config, mla_use_nope=False))
    assert ["rotary" in part for part in unrun_parts(rotary)] == [True]


def test_loading_kimi_k3_stops_naming_every_missing_part(tmp_path):
    import torch

    from engine import LLM
    from engine.devtools.testing.tokenizers import save_kimi_tokenizer
    from engine.models.loader import load_model

    folder = k3_config_dir(tmp_path)
    with pytest.raises(UnsupportedModelError) as raised:
        load_model(folder, torch.float32, torch.device("cpu"))
    for part in EXPECTED_PARTS:
        assert part in str(raised.value)
    assert str(raised.value).startswith("Kimi K3 needs parts this engine does not run yet")
    save_kimi_tokenizer(folder)  # a real K3 folder has its tokenizer; LLM reads it first
    with pytest.raises(UnsupportedModelError, match="attention residuals"):
        LLM(str(folder), attention_backend="torch")
