"""GGUF files of every family the engine serves, as llama.cpp's own converter writes them.

Each family's tiny random transformers checkpoint goes through llama.cpp's
convert_hf_to_gguf.py (the copy `make setup` fetches into .venv/peers; see
llama_cpp_convert.py for the two answers the test supplies), then back
through `convert_gguf`: config fields the engine reads, every tensor (f32:
exactly; q8_0: exactly as gguf's own quantizer and dequantizer round them),
the tokenizer, and the engine's logits against transformers' on the original.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from safetensors.torch import load_file

from engine import LLM, SamplingParams
from engine.devtools.testing.checkpoints import (
    build_deepseek_v3,
    build_glm4_moe,
    tiny_glm4,
    tiny_qwen2,
)
from engine.devtools.testing.tokenizers import (
    CORPUS,
    GLM_EOS_TOKENS,
    GLM_VOCAB_SIZE,
    KIMI_VOCAB_SIZE,
    glm_token_id,
    kimi_token_id,
    save_glm_tokenizer,
    save_kimi_tokenizer,
    train_byte_bpe,
)
from engine.errors import ModelError
from engine.model_files.gguf_convert import convert_gguf, read_gguf
from engine.model_files.gguf_models import plan_model
from engine.model_files.model_config import load_config
from engine.tokenizers.loading import load_tokenizer
from tests.engine.checkpoints import reference_logits
from tests.engine.test_cpu_fused_decode_families import WIDE_MLA

REPO = Path(__file__).resolve().parents[2]
LLAMA_CPP = Path(
    os.environ.get("RESIDENT_LLAMA_CPP") or REPO / ".venv" / "peers" / "llama.cpp-0.3.36"
)
CONVERT = Path(__file__).with_name("llama_cpp_convert.py")
FP32_LOGIT_TOL = 1e-4
PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 301, 4, 76, 200, 9]
TEXTS = [
    "Hello world! The year 2024 had 366 days; 3.14159 and 1,000,000.",
    "def add(a, b):\n    return a + b  # sum\n\n\tTabs  and   spaces ",
    "Cafe\u0301 man\u0303ana: decomposed accents (Qwen2 composes them first, NFC).",
    "Café naïve résumé — 你好，世界！读取文件 😀👍🏽 Россия I'm sure they'll say it's FINE.",
    "<|im_start|>user\nHi<|im_end|>\n<think>x</think>",
    "[gMASK]<sop><|user|>\nfix it /nothink<|assistant|><tool_call>run<arg_key>cmd</arg_key>",
    "<|im_user|>user<|im_middle|>Hi<|im_end|><|tool_call_begin|>[EOT]<|reserved_token_500|>",
]

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def save_qwen2_tokenizer(directory: Path, vocab_size: int):
    """Qwen2's tokenizer form: NFC, then its split (digits one by one), then byte-level BPE."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    from engine.devtools.testing.chat_templates import CHATML_TEMPLATE

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train_byte_bpe(vocab_size, QWEN2_SPLIT, special_tokens=specials, corpus=CORPUS * 3)
    tok.normalizer = normalizers.NFC()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(directory))
    return fast


def _with_routing_fields(build):
    """DeepSeek V3's and Kimi K2's own config.json say how they route; transformers'
    config class drops the fields, so they are put back (llama.cpp reads scoring_func)."""

    def build_and_add(directory: Path) -> Path:
        path = build(directory)
        config = json.loads((path / "config.json").read_text())
        config.update(scoring_func="sigmoid", topk_method="noaux_tc")
        (path / "config.json").write_text(json.dumps(config, indent=2))
        return path

    return build_and_add


KIMI_IDS = {
    "bos_token_id": kimi_token_id("[BOS]"),
    "eos_token_id": kimi_token_id("[EOS]"),
    "pad_token_id": kimi_token_id("[PAD]"),
}
# family: (builder of the original checkpoint, GGUF architecture, tokenizer.ggml.pre)
FAMILIES = {
    "qwen2": (lambda d: tiny_qwen2(d, tokenizer=save_qwen2_tokenizer), "qwen2", "qwen2"),
    "glm4": (
        lambda d: tiny_glm4(d, tokenizer=save_glm_tokenizer, vocab_size=GLM_VOCAB_SIZE),
        "glm4",
        "glm4",
    ),
    "glm4moe": (
        lambda d: build_glm4_moe(d, tokenizer=save_glm_tokenizer, vocab_size=GLM_VOCAB_SIZE),
        "glm4moe",
        "glm4",
    ),
    "deepseek_v3": (
        _with_routing_fields(lambda d: build_deepseek_v3(d, vocab_size=320)),
        "deepseek2",
        "gpt-2",
    ),
    "kimi_k2": (
        _with_routing_fields(
            lambda d: build_deepseek_v3(
                d, tokenizer=save_kimi_tokenizer, vocab_size=KIMI_VOCAB_SIZE, **KIMI_IDS
            )
        ),
        "deepseek2",
        "kimi-k2",
    ),
}

# Families for a few tests each, outside the parametrized ones above: MLA widths the grid
# decode and the fused decode step take (attn_k_b rows of 32 values, whole Q8_0 blocks;
# the tiny config's 16 are left F16 by llama.cpp).
MORE_FAMILIES = {
    "deepseek_v3_wide": (
        _with_routing_fields(lambda d: build_deepseek_v3(d, vocab_size=320, **WIDE_MLA)),
        "deepseek2",
        "gpt-2",
    ),
}


@pytest.fixture(scope="session")
def llama_cpp() -> Path:
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not in {LLAMA_CPP} (run `make setup`)")
    return LLAMA_CPP


def llama_cpp_gguf(
    llama_cpp: Path, model: Path, out: Path, pre: str, outtype: str, *options: str
) -> Path:
    command = [sys.executable, str(CONVERT), str(llama_cpp), pre, *options, str(model)]
    command += ["--outtype", outtype, "--outfile", str(out)]
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return out


class Family:
    """One family's original checkpoint and its GGUF files (built on first use)."""

    def __init__(self, name: str, root: Path, llama_cpp: Path):
        build, self.architecture, self.pre = {**FAMILIES, **MORE_FAMILIES}[name]
        self.name, self.root, self.llama_cpp = name, root, llama_cpp
        self.original = build(root / "original")
        self._files: dict[tuple, Path] = {}

    def gguf(self, outtype: str, *options: str) -> Path:
        key = (outtype, *options)
        if key not in self._files:
            out = self.root / f"{outtype}{''.join(options).replace('-', '_')}.gguf"
            llama_cpp_gguf(self.llama_cpp, self.original, out, self.pre, outtype, *options)
            self._files[key] = out
        return self._files[key]

    def converted(self, outtype: str, *options: str) -> Path:
        gguf = self.gguf(outtype, *options)
        folder = gguf.with_suffix("")
        if not folder.is_dir():
            convert_gguf(gguf, folder)
        return folder

    def weights(self) -> dict[str, torch.Tensor]:
        tensors = {}
        for path in sorted(self.original.glob("*.safetensors")):
            tensors.update(load_file(path))
        return tensors


@pytest.fixture(scope="session")
def families(tmp_path_factory, llama_cpp):
    made: dict[str, Family] = {}

    def family(name: str) -> Family:
        if name not in made:
            made[name] = Family(name, tmp_path_factory.mktemp(name), llama_cpp)
        return made[name]

    return family


def _q8_0_round_trip(values: torch.Tensor) -> torch.Tensor:
    """What llama.cpp's q8_0 file holds for `values` (gguf's own quantizer and dequantizer)."""
    array, Q8_0 = values.float().numpy(), GGMLQuantizationType.Q8_0
    decoded = quants.dequantize(quants.quantize(array, Q8_0), Q8_0)
    return torch.from_numpy(np.asarray(decoded, dtype=np.float32).reshape(array.shape))


# --- tensors and config --------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_float32_file_gives_back_every_tensor_exactly(families, name):
    family = families(name)
    original = family.weights()
    converted = load_file(family.converted("f32") / "model.safetensors")
    assert set(converted) == set(original)
    for key, value in original.items():
        assert converted[key].dtype == torch.float32
        assert torch.equal(converted[key], value.float()), key


@pytest.mark.parametrize("name", FAMILIES)
def test_q8_0_file_dequantizes_as_gguf_rounds_it(families, name):
    family = families(name)
    original = family.weights()
    converted = load_file(family.converted("q8_0") / "model.safetensors")
    assert set(converted) == set(original)
    quantized = 0
    for key, value in original.items():
        value, got = value.float(), converted[key]
        # llama.cpp keeps 1-D tensors and the MoE router in F32, and a matrix whose rows
        # are not whole 32-value blocks (the tiny MLA's per-head kv_b blocks) in F16.
        forms = {"f32": value, "f16": value.half().float()}
        if value.dim() == 2 and value.shape[1] % 32 == 0:
            forms["q8_0"] = _q8_0_round_trip(value)
        stored = [form for form, values in forms.items() if torch.equal(got, values)]
        assert stored, f"{key} is none of {list(forms)} of the original"
        if stored == ["q8_0"]:
            quantized += 1
            # One Q8_0 step of the largest value is the format's bound.
            assert (got - value).abs().max() <= value.abs().max() / 127, key
    assert quantized > len(original) // 3


def _engine_config(folder: Path) -> dict:
    config = load_config(folder)
    rope = {k: v for k, v in config.rope.items() if k != "type"}
    rope.setdefault("partial_rotary_factor", config.partial_rotary_factor)
    return {"raw": config.raw, "rope": rope, "architecture": config.architecture}


CONFIG_FIELDS = [
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "head_dim", "attention_bias", "use_qk_norm",
    "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
    "first_k_dense_replace", "routed_scaling_factor", "norm_topk_prob", "n_group", "topk_group",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "rope_interleave", "scoring_func", "topk_method",
]  # fmt: skip


@pytest.mark.parametrize("name", FAMILIES)
def test_config_says_what_the_original_says(families, name):
    family = families(name)
    _, metadata, _ = read_gguf(family.gguf("f32"))
    assert metadata["general.architecture"] == family.architecture
    assert metadata["tokenizer.ggml.pre"] == family.pre
    ours, original = _engine_config(family.converted("f32")), _engine_config(family.original)
    assert ours["architecture"] == original["architecture"]
    for key in CONFIG_FIELDS:
        if key in original["raw"]:
            assert ours["raw"].get(key) == pytest.approx(original["raw"][key]), key
    assert ours["rope"] == pytest.approx(original["rope"])
    assert ours["rope"].keys() == original["rope"].keys()


def test_generation_stops_where_the_family_does(families):
    """GLM-4.5 stops at <|endoftext|>, <|user|> and <|observation|> (its own
    generation_config); Kimi K2 at <|im_end|> (llama.cpp also at [EOS] and [EOT])."""
    stops = {}
    for name in ("glm4moe", "kimi_k2"):
        folder = families(name).converted("q8_0")
        stops[name] = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert stops["glm4moe"] == [glm_token_id(token) for token in GLM_EOS_TOKENS]
    assert sorted(stops["kimi_k2"]) == [kimi_token_id(t) for t in ("[EOS]", "<|im_end|>", "[EOT]")]


# --- the engine on the converted folder ----------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_engine_logits_match_transformers_on_the_original(families, name):
    family = families(name)
    reference = reference_logits(family.original, PROMPT)
    with LLM(str(family.converted("f32")), dtype="float32", kv_cache_dtype="auto") as llm:
        ours = llm.prompt_logits(PROMPT)
    assert ours.shape == reference.shape
    assert (ours - reference).abs().max().item() < FP32_LOGIT_TOL


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizer_matches_the_original(families, name):
    family = families(name)
    original = load_tokenizer(family.original)  # Kimi's: the engine's own tiktoken reader
    ours = load_tokenizer(family.converted("f32"))
    for text in TEXTS:
        ids = original.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids) == original.decode(ids), text
        skipped = original.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=True) == skipped, text
    assert ours.chat_template == original.chat_template


# --- forms of the files --------------------------------------------------------


@pytest.mark.parametrize("name", ["deepseek_v3", "kimi_k2"])
def test_deepseek_file_with_whole_kv_b_reads_as_the_split_one(families, name):
    family = families(name)
    legacy = family.gguf("f32", "--legacy-kv-b")
    _, metadata, model = read_gguf(legacy)
    assert "deepseek2.attention.key_length_mla" not in metadata
    assert metadata["deepseek2.attention.key_length"] == 24  # nope + rope, the old spelling
    kv_b = next(p for p in model.plans if p.name.endswith("layers.0.self_attn.kv_b_proj.weight"))
    assert kv_b.rows_only and kv_b.sources == ("blk.0.attn_kv_b.weight",)
    converted = load_file(family.converted("f32", "--legacy-kv-b") / "model.safetensors")
    for key, value in family.weights().items():
        assert torch.equal(converted[key], value), key


@pytest.mark.parametrize("name", ["qwen2", "glm4moe"])
def test_fused_qkv_is_split_by_rows(families, name):
    family = families(name)
    options = ("--fuse-qkv",)
    _, _, model = read_gguf(family.gguf("f32", *options))
    plans = {plan.name: plan for plan in model.plans}
    k_bias = plans["model.layers.1.self_attn.k_proj.bias"]
    assert k_bias.sources == ("blk.1.attn_qkv.bias",) and k_bias.pieces[0].rows == range(64, 96)
    converted = load_file(family.converted("f32", *options) / "model.safetensors")
    for key, value in family.weights().items():
        assert torch.equal(converted[key], value), key


def test_plans_keep_rows_where_rows_say_it(families):
    """The plan a packed loader reads: experts are runs of rows of the stacked tensor;
    only kv_b_proj rebuilt from attn_k_b needs dequantized values."""
    _, _, model = read_gguf(families("kimi_k2").gguf("q8_0"))
    plans = {plan.name: plan for plan in model.plans}
    expert = plans["model.layers.1.mlp.experts.3.up_proj.weight"]
    assert expert.rows_only and len(expert.pieces) == 1
    assert expert.pieces[0].source == "blk.1.ffn_up_exps.weight"
    assert expert.pieces[0].rows == range(3 * 32, 4 * 32)
    assert plans["model.layers.1.mlp.gate.e_score_correction_bias"].sources == (
        "blk.1.exp_probs_b.bias",
    )
    assert plans["model.layers.1.mlp.gate.weight"].sources == ("blk.1.ffn_gate_inp.weight",)
    shared = plans["model.layers.1.mlp.shared_experts.down_proj.weight"]
    assert shared.sources == ("blk.1.ffn_down_shexp.weight",)
    kv_b = plans["model.layers.0.self_attn.kv_b_proj.weight"]
    assert not kv_b.rows_only and kv_b.shape == (4 * (16 + 16), 16)
    assert [p.transform for p in kv_b.pieces[:2]] == ["transpose", None]
    assert sum(not plan.rows_only for plan in model.plans) == 2  # kv_b_proj of each layer


def test_multi_token_prediction_blocks_are_left_out(families):
    """A glm4moe file counts its MTP block in block_count (nextn_predict_layers 1):
    tensors there are left out, tensors past it refused."""
    _, metadata, model = read_gguf(families("glm4moe").gguf("f32"))
    assert metadata["glm4moe.block_count"] == 3 and model.config["num_hidden_layers"] == 2
    _, _, shapes = _shapes_of(families("glm4moe").gguf("f32"))
    with_mtp = {**shapes, "blk.2.nextn.eh_proj.weight": (64, 128), "blk.2.attn_norm.weight": (64,)}
    assert plan_model(metadata, with_mtp).skipped == (
        "blk.2.nextn.eh_proj.weight",
        "blk.2.attn_norm.weight",
    )
    with pytest.raises(ModelError, match="'blk.3.attn_norm.weight' has no place"):
        plan_model(metadata, {**with_mtp, "blk.3.attn_norm.weight": (64,)})


def _shapes_of(path: Path):
    reader, metadata, model = read_gguf(path)
    shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
    return metadata, model, shapes


def test_softmax_routing_is_refused_by_name(families):
    metadata, _, shapes = _shapes_of(families("kimi_k2").gguf("f32"))
    assert metadata["deepseek2.expert_gating_func"] == 2
    without = {k: v for k, v in metadata.items() if k != "deepseek2.expert_gating_func"}
    with pytest.raises(ModelError, match="DeepSeek V2's softmax"):
        plan_model(without, shapes)
    with pytest.raises(ModelError, match="expert_gating_func 1"):
        plan_model({**metadata, "deepseek2.expert_gating_func": 1}, shapes)


def test_unknown_pre_tokenizer_is_refused_by_name(families):
    from engine.model_files.gguf_tokenizer import rebuild_tokenizer

    metadata, _, _ = _shapes_of(families("kimi_k2").gguf("f32"))
    with pytest.raises(ModelError, match="pre-tokenizer 'kimi-k3' is not supported.*kimi-k2"):
        rebuild_tokenizer({**metadata, "tokenizer.ggml.pre": "kimi-k3"}, 512, 512)


# --- a .gguf path given to the engine -------------------------------------------


@pytest.mark.parametrize("name", ["glm4moe", "kimi_k2"])
def test_llm_takes_the_gguf_file_itself(families, name, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    family = families(name)
    reference = reference_logits(family.original, PROMPT)
    with LLM(str(family.gguf("f32")), dtype="float32", kv_cache_dtype="auto") as llm:
        assert (llm.prompt_logits(PROMPT) - reference).abs().max().item() < FP32_LOGIT_TOL
        out = llm.generate(["Read the file"], SamplingParams(max_tokens=4, temperature=0))[0]
        assert len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize("name", ["glm4moe", "kimi_k2"])
def test_a_q8_0_file_read_directly_packs_what_its_float32_folder_packs(
    families, name, tmp_path, monkeypatch
):
    """`LLM("FILE.gguf")` reads the weights from the file (engine/models/gguf_loader.py):
    its Q8_0 blocks become the grid kernel's codes as they are, so the model computes
    bit for bit what the float32 folder of the same file computes once packed, experts
    and MLA's latent projection included, and no packed layer holds a dense copy."""
    from engine.cpu_kernels.library import unavailable
    from engine.layers.cpu_grid_weights import grid_weight_of

    if unavailable():
        pytest.skip(f"CPU kernels: {unavailable()}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    family = families(name)
    direct = LLM(str(family.gguf("q8_0")), dtype="bfloat16", kv_cache_dtype="bf16")
    folder = LLM(str(family.converted("q8_0")), dtype="bfloat16", kv_cache_dtype="bf16")
    assert direct.engine.linear_methods == folder.engine.linear_methods
    packed = [m for m in direct.engine.model.modules() if grid_weight_of(m) is not None]
    assert len(packed) >= 10 and all(m.weight.numel() == 0 for m in packed)
    assert torch.equal(direct.prompt_logits(PROMPT), folder.prompt_logits(PROMPT))


# The grid path against the dense one on the same step: it quantizes the queries' nope part
# and the latent output to int8 (test_mla_decode_grid.py), 0.5-0.9% of the largest output.
GRID_STEP_TOL = 0.02


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_mla_decode_multiplies_the_files_k_b_and_v_b_blocks(families, kv, tmp_path, monkeypatch):
    """A deepseek2 file's attn_k_b and attn_v_b reach the MLA decode kernel as grid
    weights, with the FP8 cache's gain and rotation applied at run time: every decode
    step of a generation agrees with the dense kernel on kv_b_proj as the model holds it
    (rebuilt from the same blocks, gain and rotation folded in). Logits are not compared:
    the tiny MoE's routing turns a 1% difference into a different expert."""
    from engine.cpu_kernels import mla_decode as mla_kernel
    from engine.cpu_kernels.library import unavailable

    if unavailable():
        pytest.skip(f"CPU kernels: {unavailable()}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    llm = LLM(str(families("deepseek_v3_wide").gguf("q8_0")), dtype="bfloat16", kv_cache_dtype=kv)
    llm.engine.model.model.decode_step = None  # the modules: the Python wrapper is called
    attentions = [layer.self_attn for layer in llm.engine.model.model.layers]
    assert all(attention.latent_grid is not None for attention in attentions)
    assert all((a.latent_grid.block > 0) == (kv == "fp8_e4m3") for a in attentions)
    by_grid = {id(a.latent_grid): a.kv_b_proj.weight for a in attentions}
    grid_decode, errors = mla_kernel.mla_decode_grid, []

    def checked(q_nope, q_rope, grid, *args):
        got = grid_decode(q_nope, q_rope, grid, *args)
        dense = by_grid[id(grid)].to(q_nope.dtype).contiguous()
        want = mla_kernel.mla_decode(q_nope, q_rope, dense, *args).float()
        errors.append(((got.float() - want).abs().max() / want.abs().max()).item())
        return got

    monkeypatch.setattr(mla_kernel, "mla_decode_grid", checked)
    prompts = [[5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12], [33, 201, 4, 76] * 5]
    llm.generate(prompts, SamplingParams(max_tokens=9, temperature=0, ignore_eos=True))
    assert len(errors) >= 8 * len(attentions)  # every decode step of every layer
    assert 0 < max(errors) <= GRID_STEP_TOL


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_a_kimi_file_decodes_in_one_c_call_as_its_modules_do(families, kv, tmp_path, monkeypatch):
    """The fused decode step (engine/models/cpu_mla_decode_step.py) on a file's blocks,
    W_UK / W_UV as grid weights: the same logits, bit for bit, as the modules."""
    from engine.cpu_kernels.library import unavailable
    from tests.engine.test_cpu_fused_decode_families import fused_and_modules_agree

    if unavailable():
        pytest.skip(f"CPU kernels: {unavailable()}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    llm = LLM(str(families("deepseek_v3_wide").gguf("q8_0")), dtype="bfloat16", kv_cache_dtype=kv)
    assert all(layer.self_attn.latent_grid is not None for layer in llm.engine.model.model.layers)
    fused_and_modules_agree(llm, monkeypatch)


# --- plans without llama.cpp ------------------------------------------------------


def test_llama_q_and_k_are_their_rows_reordered(tmp_path):
    from tests.engine.gguf_fixtures import tiny_llama, tiny_tokenizer, write_tiny_gguf

    tokenizer = tiny_tokenizer()
    path = tmp_path / "llama.gguf"
    write_tiny_gguf(path, tiny_llama(tokenizer.get_vocab_size(), True), tokenizer)
    _, _, model = read_gguf(path)
    assert all(plan.rows_only and len(plan.pieces) == 1 for plan in model.plans)
    plans = {plan.name: plan for plan in model.plans}
    k_rows = plans["model.layers.0.self_attn.k_proj.weight"].pieces[0].rows
    # 2 KV heads of 16 rows: each head's two rotary halves come from its even, then odd rows.
    assert k_rows[:10] == (0, 2, 4, 6, 8, 10, 12, 14, 1, 3) and k_rows[16:18] == (16, 18)
    assert plans["model.layers.0.self_attn.v_proj.weight"].pieces[0].rows == range(32)


def test_glm4_gate_up_from_two_tensors_is_their_rows_one_after_the_other(families):
    metadata, _, shapes = _shapes_of(families("glm4").gguf("f32"))
    split = dict(shapes)
    for layer in range(2):
        rows, columns = split.pop(f"blk.{layer}.ffn_up.weight")
        split[f"blk.{layer}.ffn_gate.weight"] = split[f"blk.{layer}.ffn_up.weight"] = (
            rows // 2,
            columns,
        )
    plans = {plan.name: plan for plan in plan_model(metadata, split).plans}
    gate_up = plans["model.layers.1.mlp.gate_up_proj.weight"]
    assert gate_up.shape == (256, 64) and gate_up.rows_only
    assert [(p.source, p.rows) for p in gate_up.pieces] == [
        ("blk.1.ffn_gate.weight", range(128)),
        ("blk.1.ffn_up.weight", range(128)),
    ]
