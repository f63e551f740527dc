"""`resident plan`: planner arithmetic against hand-computed values, presets, inputs, CLI shape.

Every expected number below is worked out by hand from the published config
values (DESIGN.md §3), not read back from the planner. Shared formula
(engine/planner/capacity.py), per GPU of one TP=8 replica on 8 x H200:

    KV budget = 143,771 MiB x 0.9 - weights on the GPU - 10 GiB
    tokens    = whole 16-token pages of (KV bytes per token on one GPU) in the budget
"""

from __future__ import annotations

import json
import math
import struct
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from engine.errors import EngineError
from engine.kv.sizing import KVLayout, capacity_tokens, kv_bytes_per_token
from engine.model_files.model_config import parse_config
from engine.planner.capacity import PlanError, PlanInputs, kv_layout_for, plan
from engine.planner.presets import GLM45, PRESETS
from engine.planner.weight_bytes import scheme_from_config

GIB = 2**30
H200 = 143771 * 2**20  # nvidia-smi memory.total
USABLE = H200 * 9 // 10  # memory fraction 0.9
RESERVE = 10 * GIB  # activation reserve
PAGE = 16


def tokens(weights_per_gpu: int, kv_bytes_per_gpu: int) -> int:
    """Whole pages of KV that fit what the weights and the reserve leave."""
    budget = USABLE - weights_per_gpu - RESERVE
    return budget // (kv_bytes_per_gpu * PAGE) * PAGE


def fp8(rows: int, cols: int) -> int:
    """One FP8 matrix: a byte per weight plus a float32 scale per 128x128 block."""
    return rows * cols + 4 * math.ceil(rows / 128) * math.ceil(cols / 128)


def int4_g32(rows: int, cols: int) -> int:
    """One INT4 matrix: half a byte per weight plus a BF16 scale per 32 weights of a row."""
    return rows * cols // 2 + 2 * rows * (cols // 32)


# ---- Kimi K2.x: h 7168, 61 layers (1 dense + 60 MoE), 64 heads, MLA, 384 experts, vocab 163840
H, L, V = 7168, 61, 163840
Q_A, Q_B = (1536, 7168), (64 * (128 + 64), 1536)  # q_lora_rank 1536; nope 128 + rope 64
KV_A, KV_B = (512 + 64, 7168), (64 * (128 + 128), 512)  # kv_lora_rank 512; nope 128 + v 128
O_PROJ = (7168, 64 * 128)
DENSE = [(18432, 7168), (18432, 7168), (7168, 18432)]  # gate, up, down
EXPERT = [(2048, 7168), (2048, 7168), (7168, 2048)]  # moe_intermediate 2048
KIMI_NORMS = (2 * L + 1) * H + L * 1536 + L * 512  # layer norms, final, q_a and kv_a norms
KIMI_ROUTER = 60 * (384 * H + 384)  # gate weight and correction bias, 60 MoE layers


def kimi_bytes_per_gpu(quantized, experts_quantized, tp: int = 8) -> int:
    """Replicated on every rank: norms, routers, q_a and kv_a. The rest is split over TP."""
    mat = quantized  # bytes of one attention/MLP matrix
    replicated = 2 * KIMI_NORMS + 2 * KIMI_ROUTER + L * (mat(*Q_A) + mat(*KV_A))
    sharded = (
        2 * (2 * V * H)  # embed_tokens and lm_head, BF16
        + L * (mat(*Q_B) + mat(*KV_B) + mat(*O_PROJ))
        + sum(mat(*m) for m in DENSE)  # layer 0
        + 60 * sum(mat(*m) for m in EXPERT)  # one shared expert per MoE layer
        + 60 * 384 * sum(experts_quantized(*m) for m in EXPERT)
    )
    return replicated + sharded // tp


def bf16(rows: int, cols: int) -> int:
    return 2 * rows * cols


def test_kimi_k26_reproduces_the_published_figure():
    # K2.6: INT4 group-32 routed experts, everything else BF16.
    weights = kimi_bytes_per_gpu(bf16, int4_g32)
    assert weights == 76_182_547_456  # 70.95 GiB per GPU (DESIGN.md: ~554 GiB / 8 + replicas)
    mla_bf16 = 61 * (512 + 64) * 2  # 70,272 B/token, the latent replicated on every rank
    r = plan("kimi-k2.6")
    assert r["weights"]["per_gpu_bytes"] == weights
    assert r["weights"]["total_bytes"] / GIB == pytest.approx(553.4, abs=0.1)
    assert r["kv_bytes_per_token"] == {"bf16": 70_272, "fp8_e4m3": 35_136}
    assert r["kv_bytes_per_token_per_gpu"] == {"bf16": mla_bf16, "fp8_e4m3": mla_bf16 // 2}
    assert r["capacity_tokens"] == {
        "bf16": tokens(weights, mla_bf16),
        "fp8_e4m3": tokens(weights, mla_bf16 // 2),
    }
    # Published (SGLang, 8 x H200): about 686k tokens BF16, 1.37M FP8, ratio 2.0.
    assert r["capacity_tokens"]["bf16"] == pytest.approx(686_000, rel=0.05)
    assert r["capacity_tokens"]["fp8_e4m3"] == pytest.approx(1_370_000, rel=0.05)
    assert r["fp8_over_bf16"] == pytest.approx(2.0, abs=0.001)
    assert r["context_tokens"] == 262_144
    assert r["concurrent_requests"] == {
        "bf16": tokens(weights, mla_bf16) // 262_144,
        "fp8_e4m3": tokens(weights, mla_bf16 // 2) // 262_144,
    }
    assert r["assumptions"]["memory_fraction"] == 0.9
    assert r["assumptions"]["activation_reserve_gib"] == 10.0
    # At ~21k tokens a request, the published 32 vs 64 concurrent requests.
    at_21k = plan("kimi-k2.6", PlanInputs(context=21_000))["concurrent_requests"]
    assert at_21k["bf16"] == pytest.approx(32, rel=0.05)
    assert at_21k["fp8_e4m3"] == pytest.approx(64, rel=0.05)


def test_kimi_k25_is_shaped_like_k26():
    assert plan("kimi-k2.5")["capacity_tokens"] == plan("kimi-k2.6")["capacity_tokens"]


def test_kimi_k2_fp8_does_not_fit_8xh200_but_16():
    weights = kimi_bytes_per_gpu(fp8, fp8)  # FP8 block-128 everywhere but embeddings/norms/routers
    r = plan("kimi-k2")
    assert r["weights"]["per_gpu_bytes"] == weights
    assert weights > USABLE - RESERVE
    assert r["capacity_tokens"] == {"bf16": 0, "fp8_e4m3": 0}
    assert r["warnings"]
    r16 = plan("kimi-k2", PlanInputs(num_gpus=16))  # Moonshot's smallest FP8 unit on H200
    weights16 = kimi_bytes_per_gpu(fp8, fp8, tp=16)
    assert r16["tp"] == 16 and r16["weights"]["per_gpu_bytes"] == weights16
    assert r16["capacity_tokens"]["bf16"] == tokens(weights16, 70_272)


def glm_moe_bytes_per_gpu(h, layers, dense, inter, moe_inter, experts, qk_norm):
    """GLM-4.5-style MoE in BF16 at TP=8: 96 heads, 8 KV heads of 128, vocab 151552, 1 MTP layer."""
    n = layers + 1  # the MTP layer is one more decoder layer (weights counted)
    moe = n - dense
    q, kv = 96 * 128, 8 * 128
    sharded = (
        2 * 151552 * h  # embed_tokens, lm_head
        + n * (q * h + 2 * kv * h + h * q)  # q, k, v (8 heads: one per rank), o
        + n * (q + 2 * kv)  # q/k/v biases
        + dense * 3 * inter * h
        + moe * (experts + 1) * 3 * moe_inter * h  # routed experts and the shared expert
    )
    replicated = (
        (2 * n + 1) * h  # input/post-attention norms and the final norm
        + (n * 2 * 128 if qk_norm else 0)  # q_norm, k_norm
        + moe * (experts * h + experts)  # router and its correction bias
        + h * 2 * h
        + 3 * h  # MTP eh_proj, enorm, hnorm, shared_head.norm
    )
    return 2 * replicated + 2 * sharded // 8


@pytest.mark.parametrize(
    ("name", "context"), [("glm-4.5", 131072), ("glm-4.6", 202752), ("glm-4.7", 202752)]
)
def test_glm_4x_figures_on_8xh200(name, context):
    weights = glm_moe_bytes_per_gpu(5120, 92, 3, 12288, 1536, 160, qk_norm=True)
    per_gpu_bf16 = 2 * 92 * (8 // 8) * 128 * 2  # one KV head per rank: 47,104 B
    r = plan(name)
    assert r["weights"]["per_gpu_bytes"] == weights
    assert r["weights"]["params"] / 1e9 == pytest.approx(356.8, abs=0.1)  # 355B + MTP layer
    assert r["kv_bytes_per_token"] == {"bf16": 376_832, "fp8_e4m3": 188_416}  # DESIGN.md §3
    assert r["kv_bytes_per_token_per_gpu"] == {"bf16": 47_104, "fp8_e4m3": 23_552}
    assert per_gpu_bf16 == 47_104
    bf16_tokens, fp8_tokens = tokens(weights, 47_104), tokens(weights, 23_552)
    assert r["capacity_tokens"] == {"bf16": bf16_tokens, "fp8_e4m3": fp8_tokens}
    assert (bf16_tokens, fp8_tokens) == (754_128, 1_508_272)
    assert r["fp8_over_bf16"] == pytest.approx(2.0, abs=0.001)
    assert r["concurrent_requests"] == {
        "bf16": bf16_tokens // context,
        "fp8_e4m3": fp8_tokens // context,
    }


def test_glm_45_air():
    weights = glm_moe_bytes_per_gpu(4096, 46, 1, 10944, 1408, 128, qk_norm=False)
    r = plan("glm-4.5-air")
    assert r["weights"]["per_gpu_bytes"] == weights
    assert r["kv_bytes_per_token"]["bf16"] == 2 * 46 * 8 * 128 * 2
    assert r["capacity_tokens"]["bf16"] == tokens(weights, 2 * 46 * 1 * 128 * 2)
    assert r["capacity_tokens"]["fp8_e4m3"] == tokens(weights, 46 * 1 * 128 * 2)


def test_glm_4_9b():
    # 40 layers, h 4096, 32 heads, 2 KV heads of 128, MLP 13696, vocab 151552, four norms a layer.
    h, n = 4096, 40
    sharded = 2 * 151552 * h + n * (2 * 4096 * h + 4096) + n * 3 * 13696 * h  # embed, head, q, o
    kv = n * 2 * (256 * h + 256)  # k and v (+ bias): each rank holds one of the 2 heads
    weights = 2 * ((4 * n + 1) * h) + 2 * sharded // 8 + 2 * kv // 2
    r = plan("glm-4-9b")
    assert r["weights"]["per_gpu_bytes"] == weights
    assert r["kv_bytes_per_token"] == {"bf16": 2 * 40 * 2 * 128 * 2, "fp8_e4m3": 20_480}
    assert r["kv_bytes_per_token_per_gpu"]["bf16"] == 2 * 40 * 1 * 128 * 2
    assert r["capacity_tokens"]["bf16"] == tokens(weights, 20_480)
    assert r["concurrent_requests"]["fp8_e4m3"] == tokens(weights, 10_240) // 32768


def test_smollm2_135m():
    # 30 layers, h 576, 9 heads, 3 KV heads of 64, MLP 1536, vocab 49152, tied embeddings.
    h, n = 576, 30
    sharded = 49152 * h + n * (2 * 576 * h + 3 * 1536 * h)  # embed (tied), q, o, MLP
    kv = n * 2 * 192 * h  # k, v: one of the 3 heads per rank
    weights = 2 * (2 * n + 1) * h + 2 * sharded // 8 + 2 * kv // 3
    r = plan("smollm2-135m")
    assert r["weights"]["per_gpu_bytes"] == weights
    assert r["weights"]["params"] == 134_515_008  # SmolLM2-135M
    assert r["kv_bytes_per_token"]["bf16"] == 2 * 30 * 3 * 64 * 2
    assert r["capacity_tokens"]["bf16"] == tokens(weights, 2 * 30 * 1 * 64 * 2)
    assert any("9 attention heads" in w for w in r["warnings"])
    one = plan("smollm2-135m", PlanInputs(num_gpus=1, gpu="h100"))
    budget = 81559 * 2**20 * 9 // 10 - 2 * 134_515_008 - RESERVE
    assert one["capacity_tokens"]["fp8_e4m3"] == budget // (11_520 * PAGE) * PAGE
    assert one["warnings"] == []


def test_every_preset_declares_its_weight_form_and_layout():
    for name, preset in PRESETS.items():
        cfg = parse_config(preset.config)
        assert scheme_from_config(cfg).name == preset.weights, name
        r = plan(name)
        per_token = r["kv_bytes_per_token"]
        if r["kv_layout"].get("index_layers") is None:  # every cached value is FP8
            assert per_token["bf16"] == 2 * per_token["fp8_e4m3"], name
        # DSA's indexer keys stay BF16 (engine/kv/dsa_pool.py), so there FP8 gains less.
        ratio = per_token["bf16"] / per_token["fp8_e4m3"]
        assert r["fp8_over_bf16"] in (None, pytest.approx(ratio, abs=0.001)), name


def test_planner_layout_is_the_models_layout():
    from engine.models.base import CausalLM
    from engine.models.deepseek_v3 import mla_kv_layout

    kimi = parse_config(PRESETS["kimi-k2.6"].config)
    mla = mla_kv_layout(kimi)
    assert kv_layout_for(kimi) == KVLayout(mla.num_layers, "mla", latent_dim=mla.latent_dim)
    glm = parse_config(GLM45)
    assert kv_layout_for(glm) == CausalLM.kv_layout(SimpleNamespace(config=glm))


def test_sizing_keeps_its_signatures():
    layout = KVLayout(num_layers=92, kind="gqa", num_kv_heads=8, head_dim=128)
    assert kv_bytes_per_token(layout, "fp8_e4m3") == 188_416
    assert capacity_tokens(188_416 * 100, layout, "fp8_e4m3", 16) == 96
    assert capacity_tokens(188_416 * 100, layout, "fp8_e4m3", 16, tp=8) == 800
    assert capacity_tokens(-5, layout, "bf16", 16) == 0


def test_config_json_path_and_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GLM45))
    by_path = plan(str(tmp_path / "config.json"))
    by_folder = plan(str(tmp_path))
    preset = plan("glm-4.5")
    assert by_path["source"] == "config.json" and by_folder["source"] == "folder"
    for r in (by_path, by_folder):
        assert r["capacity_tokens"] == preset["capacity_tokens"]
        assert r["weights"]["format"] == "bf16"


def test_real_kimi_config_spelling(tmp_path):
    # kimi_k25 wrapper with a kimi_k2 text_config; transformers' rope-width head_dim is ignored.
    raw = json.loads(json.dumps(PRESETS["kimi-k2.6"].config))
    raw["text_config"]["head_dim"] = 64
    raw["text_config"]["rope_parameters"] = raw["text_config"].pop("rope_scaling")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    r = plan(str(path))
    assert r["kv_layout"] == {"kind": "mla", "layers": 61, "latent_dim": 576}
    assert r["weights"]["format"] == "int4"  # from quantization_config
    assert r["capacity_tokens"] == plan("kimi-k2.6")["capacity_tokens"]
    assert plan(str(path), PlanInputs(weights="bf16"))["weights"]["total_bytes"] > 2 * 10**12


def test_weights_from_safetensors_headers(tmp_path):
    cfg = dict(PRESETS["smollm2-135m"].config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = {
        "model.norm.weight": ("F32", [576]),  # replicated; float32 on disk, BF16 on the GPU
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [576, 576]),  # split over 8
        "model.layers.0.self_attn.k_proj.weight": ("BF16", [192, 576]),  # 1 of 3 heads a rank
    }
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = (4 if dtype == "F32" else 2) * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(
        struct.pack("<Q", len(blob)) + blob + bytes(offset)
    )
    r = plan(str(tmp_path))
    assert r["weights"]["from"] == "safetensors"
    assert r["weights"]["total_bytes"] == offset - 2 * 576
    assert r["weights"]["per_gpu_bytes"] == 2 * 576 + 2 * 576 * 576 // 8 + 2 * 192 * 576 // 3


def test_missing_and_invalid_models(tmp_path, monkeypatch):
    with pytest.raises(PlanError, match="kimi-k2.6"):
        plan("no-such-model")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(PlanError, match="resident models pull.*--model smollm2-135m"):
        plan("smollm2-135m-instruct")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not a valid config.json"):
        plan(str(bad))
    bad.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    with pytest.raises(EngineError, match="config.json has no"):
        plan(str(bad))
    with pytest.raises(PlanError, match="unknown GPU"):
        plan("glm-4.6", PlanInputs(gpu="a100"))
    with pytest.raises(PlanError, match="multiple of --tp"):
        plan("glm-4.6", PlanInputs(num_gpus=8, tp=3))


def test_gpu_memory_tp_and_assumption_overrides():
    r = plan(
        "glm-4.6",
        PlanInputs(
            gpu_memory_gib=288, num_gpus=8, tp=4, memory_fraction=0.85, activation_reserve_gib=4
        ),
    )
    weights = r["weights"]["per_gpu_bytes"]
    per_gpu = 2 * 92 * 2 * 128 * 2  # 8 KV heads over 4 ranks: two heads a rank
    budget = 288 * GIB * 85 // 100 - weights - 4 * GIB
    assert r["replicas"] == 2
    assert r["kv_bytes_per_token_per_gpu"]["bf16"] == per_gpu
    assert r["capacity_tokens"]["bf16"] == budget // (per_gpu * PAGE) * PAGE
    assert r["capacity_tokens_all_replicas"]["bf16"] == 2 * r["capacity_tokens"]["bf16"]
    assert r["assumptions"]["memory_fraction"] == 0.85


runner = CliRunner()


def test_cli_json_shape():
    from agent.cli import app

    result = runner.invoke(
        app, ["plan", "--model", "kimi-k2.6", "--gpu", "h200", "--num-gpus", "8", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("kv_bytes_per_token", "capacity_tokens", "concurrent_requests"):
        assert set(data[key]) == {"bf16", "fp8_e4m3"}
    assert data["capacity_tokens"] == plan("kimi-k2.6")["capacity_tokens"]
    assert {"memory_fraction", "activation_reserve_gib", "notes"} <= set(data["assumptions"])
    result = runner.invoke(app, ["plan", "-m", "glm-4.6", "--context", "100000", "--json"])
    assert json.loads(result.stdout)["context_tokens"] == 100_000


def test_cli_table_and_errors():
    from agent.cli import app

    result = runner.invoke(app, ["plan", "--model", "kimi-k2.6", "--model", "glm-4.6"])
    assert result.exit_code == 0, result.output
    assert "kimi-k2.6" in result.output and "glm-4.6" in result.output
    assert f"{plan('kimi-k2.6')['capacity_tokens']['bf16']:,}" in result.output
    assert "memory fraction 0.9" in result.output
    result = runner.invoke(app, ["plan", "--model", "no-such-model"])
    assert result.exit_code == 2
    assert "unknown model" in result.output and "Traceback" not in result.output
    assert runner.invoke(app, ["plan"]).exit_code == 2
    assert runner.invoke(app, ["plan", "-m", "glm-4.6", "--weights", "int3"]).exit_code == 2


def test_a_gguf_file_plans_as_the_folder_it_converts_to(tmp_path, monkeypatch):
    """The file's folder holds its config and links the weights; planning never reads
    the file whole (nor as a config.json)."""
    from engine.model_files.gguf_convert import convert_gguf
    from tests.engine.gguf_fixtures import tiny_llama, tiny_tokenizer, write_tiny_gguf

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer()
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, tiny_llama(tokenizer.get_vocab_size(), True), tokenizer)
    from_file = plan(str(gguf))
    from_folder = plan(str(convert_gguf(gguf, tmp_path / "folder")))
    assert from_file["kv_bytes_per_token"] == from_folder["kv_bytes_per_token"]
    assert from_file["capacity_tokens"] == from_folder["capacity_tokens"]
