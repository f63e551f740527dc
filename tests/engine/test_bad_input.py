"""Bad input gets a clear error that names the fix, and loses nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from engine import LLM, SamplingParams
from engine.errors import (
    CheckpointError,
    EngineError,
    KVCapacityError,
    PromptTooLongError,
    UnsupportedModelError,
)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture_lists_supported(tiny_llama_dir, tmp_path):
    model_dir = _copy(tiny_llama_dir, tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as err:
        LLM(str(model_dir))
    assert "FancyNewForCausalLM" in str(err.value)
    assert "LlamaForCausalLM" in str(err.value) and "Glm4ForCausalLM" in str(err.value)


def test_missing_shard_is_named(tiny_llama_dir, tmp_path):
    model_dir = _copy(tiny_llama_dir, tmp_path / "m")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (model_dir / shard).unlink()
    with pytest.raises(CheckpointError) as err:
        LLM(str(model_dir))
    assert shard in str(err.value) and "missing" in str(err.value)


def test_missing_config_names_accepted_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError) as err:
        LLM(str(tmp_path / "empty"))
    assert "config.json" in str(err.value)


def test_prompt_longer_than_context(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=32)
    with pytest.raises(PromptTooLongError) as err:
        llm.generate([list(range(3, 40))], SamplingParams(max_tokens=4))
    assert "37 tokens" in str(err.value) and "32" in str(err.value)
    # Nothing was lost: the engine still serves the next request.
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_generation_stops_at_context_end(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", max_model_len=20)
    out = llm.generate([list(range(3, 18))], SamplingParams(max_tokens=50, ignore_eos=True))
    assert out[0].outputs[0].finish_reason == "length"
    assert len(out[0].prompt_token_ids) + len(out[0].outputs[0].token_ids) == 20


def test_kv_budget_too_small_for_one_sequence(tiny_llama_dir):
    with pytest.raises(KVCapacityError) as err:
        LLM(str(tiny_llama_dir), kv_memory=1e-5)
    message = str(err.value)
    assert "--kv-memory" in message and "max-model-len" in message


def test_token_ids_outside_vocabulary(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32")
    with pytest.raises(EngineError, match="outside the vocabulary"):
        llm.generate([[1, 2, 99999]])
    with pytest.raises(EngineError, match="empty"):
        llm.generate([[]])


def test_invalid_sampling_params():
    with pytest.raises(EngineError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(EngineError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(EngineError, match="temperature"):
        SamplingParams(temperature=-1)


def test_invalid_engine_options(tiny_llama_dir):
    with pytest.raises(ValueError):
        LLM(str(tiny_llama_dir), kv_cache_dtype="int3")
    with pytest.raises(EngineError, match="attention backend"):
        LLM(str(tiny_llama_dir), attention_backend="magic")
