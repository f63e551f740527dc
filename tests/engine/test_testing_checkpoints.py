"""engine.devtools.testing's tiny checkpoints: the released on-disk forms, loaded and run by the engine.

Each generated folder is checked for the form its family ships in, then
loaded with `LLM` exactly as a user would (tokenizer included) and compared
with transformers on the reference folder (float32: logits within 1e-4).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from engine import LLM, SamplingParams
from engine.devtools.testing import FAMILIES, make_checkpoint
from engine.devtools.testing.layouts import INDEX_FILE, read_config
from engine.devtools.testing.tokenizers import (
    GLM_EOS_TOKENS,
    KIMI_VOCAB_SIZE,
    glm_token_id,
    kimi_ranks,
    kimi_token_id,
)
from engine.tokenizers import KimiTokenizer
from tests.engine.checkpoints import reference_logits

VARIANTS = {
    "kimi_k2": ("kimi_k2", None),
    "kimi_k25": ("kimi_k25", None),
    "glm4_moe": ("glm4_moe", None),
    "kimi_k2_fp8": ("kimi_k2", "fp8_block"),
    "kimi_k25_int4": ("kimi_k25", "int4_experts"),
}
PROMPT = "def add(a, b):\n    return a + b  # 中文 🎉"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {
        name: make_checkpoint(family, root / name, quantization=quantization)
        for name, (family, quantization) in VARIANTS.items()
    }


def _tensor_names(folder) -> dict[str, str]:
    """tensor name -> shard file, from the index (checked against the shards themselves)."""
    index = json.loads((folder / INDEX_FILE).read_text())
    found = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), "pt") as f:
            found.update(dict.fromkeys(f.keys(), shard))
    assert found == index["weight_map"]
    return found


def _tensor(folder, name):
    shard = _tensor_names(folder)[name]
    with safe_open(str(folder / shard), "pt") as f:
        return f.get_tensor(name)


# ----- on-disk forms ------------------------------------------------------------------


def test_kimi_k2_is_written_as_kimi_releases_it(tiny):
    path = tiny["kimi_k2"].path
    config = read_config(path)
    assert config["model_type"] == "kimi_k2" and "rope_parameters" not in config
    assert config["rope_theta"] == 50000.0 and config["rope_scaling"]["type"] == "yarn"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_deepseek.DeepseekV3ForCausalLM"
    assert (config["vocab_size"], config["eos_token_id"]) == (
        KIMI_VOCAB_SIZE,
        kimi_token_id("[EOS]"),
    )
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == kimi_token_id("<|im_end|>")
    names = _tensor_names(path)
    assert len(set(names.values())) > 1  # sharded, with an index
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert "model.layers.1.self_attn.kv_a_proj_with_mqa.weight" in names
    files = {p.name for p in path.iterdir()}
    assert {"tiktoken.model", "tokenizer_config.json", "tokenization_kimi.py"} <= files
    assert "tokenizer.json" not in files


def test_kimi_k25_nests_the_text_model(tiny):
    path = tiny["kimi_k25"].path
    config = read_config(path)
    assert config["model_type"] == "kimi_k25" and config["text_config"]["model_type"] == "kimi_k2"
    names = _tensor_names(path)
    assert "language_model.model.layers.0.self_attn.q_a_proj.weight" in names
    assert any(name.startswith("vision_tower.") for name in names)
    assert any(name.startswith("mm_projector.") for name in names)


def test_quantized_variants(tiny):
    fp8 = tiny["kimi_k2_fp8"].path
    assert read_config(fp8)["quantization_config"]["weight_block_size"] == [128, 128]
    weight = _tensor(fp8, "model.layers.1.mlp.experts.0.gate_proj.weight")
    assert weight.dtype == torch.float8_e4m3fn
    assert _tensor(fp8, "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv").shape == (1, 1)

    int4 = tiny["kimi_k25_int4"].path
    quant = read_config(int4)["text_config"]["quantization_config"]
    assert quant["format"] == "pack-quantized" and "lm_head" in quant["ignore"]
    expert = "language_model.model.layers.1.mlp.experts.3.up_proj"
    assert _tensor(int4, expert + ".weight_packed").dtype == torch.int32
    assert _tensor(int4, expert + ".weight_scale").dtype == torch.bfloat16
    assert _tensor(int4, expert + ".weight_shape").tolist() == [32, 64]
    assert "language_model.model.layers.1.mlp.shared_experts.up_proj.weight" in _tensor_names(int4)


def test_glm4_moe_has_glm_tokenizer_and_stop_tokens(tiny):
    path = tiny["glm4_moe"].path
    assert read_config(path)["model_type"] == "glm4_moe"
    eos = [glm_token_id(token) for token in GLM_EOS_TOKENS]
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == eos
    added = {
        t["content"]: t["special"]
        for t in json.loads((path / "tokenizer.json").read_text())["added_tokens"]
    }
    assert added["[gMASK]"] and added["<|assistant|>"]
    assert not added["<tool_call>"] and not added["<arg_key>"] and not added["</think>"]


def test_generator_is_deterministic_and_knows_its_families():
    assert kimi_ranks() == kimi_ranks()
    assert set(FAMILIES) == {"llama", "qwen2", "glm4", "glm4_moe", "kimi_k2", "kimi_k25"}
    with pytest.raises(ValueError, match="unknown family"):
        make_checkpoint("mistral", None)


# ----- the engine on them -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_engine_loads_and_matches_transformers(tiny, name):
    checkpoint = tiny[name]
    llm = LLM(str(checkpoint.path), dtype="float32", kv_cache_dtype="auto", kv_memory=0.01)
    tokenizer = llm.tokenizer
    assert isinstance(tokenizer, KimiTokenizer) == name.startswith("kimi")
    out = llm.generate(PROMPT, SamplingParams(max_tokens=6, temperature=0))[0].outputs[0]
    assert len(out.token_ids) >= 1
    if name.startswith("kimi"):
        assert llm.engine.eos_token_ids == {kimi_token_id("[EOS]"), kimi_token_id("<|im_end|>")}
    ids = tokenizer.encode(PROMPT)
    got = llm.prompt_logits(ids)
    expected = reference_logits(checkpoint.reference, ids)
    assert (got - expected).abs().max().item() < 1e-4


def test_kimi_chat_with_tools_renders_and_generates(tiny):
    llm = LLM(str(tiny["kimi_k2"].path), dtype="float32", kv_cache_dtype="auto", kv_memory=0.01)
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "list files"}]
    result = llm.chat(chat, SamplingParams(max_tokens=4, temperature=0), tools=tools)
    prompt = llm.tokenizer.decode(result.prompt_token_ids)
    assert prompt.startswith("<|im_system|>tool_declare<|im_middle|>[{")
    assert prompt.endswith(
        "<|im_user|>user<|im_middle|>list files<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )
    assert result.prompt_token_ids[-1] == kimi_token_id("<|im_middle|>")
