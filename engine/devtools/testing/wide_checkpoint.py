"""A Llama checkpoint of a chosen size (1-2 GB), written tensor by tensor.

For measuring load memory: narrow layers, many of them, bfloat16, sharded
like a real release (an index plus files of about `shard_mb`). Random
values are generated one tensor at a time and each shard is written as soon
as it is full, so the writer itself never holds more than one shard.
Values are small normals (as an initialised model's), which is all a memory
measurement needs; the tokenizer is the tests' ChatML BPE.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.devtools.testing.shard_writer import ShardWriter
from engine.devtools.testing.tokenizers import save_bpe_tokenizer


def wide_llama_config(hidden: int, layers: int, vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 11 // 4,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64,
        "num_key_value_heads": max(1, hidden // 256),
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 2,
    }


def _tensor_shapes(cfg: dict):
    h, inter, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_key_value_heads"] * 64
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (h, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, h)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (inter, h)
        yield p + "mlp.up_proj.weight", (inter, h)
        yield p + "mlp.down_proj.weight", (h, inter)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (cfg["vocab_size"], h)


def write_wide_llama(
    directory: Path, hidden: int = 1024, layers: int = 64, vocab: int = 32000, shard_mb: int = 256
) -> Path:
    """Write the checkpoint; returns the folder. hidden 1024 x 64 layers is about 1.5 GB."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = wide_llama_config(hidden, layers, vocab)
    generator = torch.Generator().manual_seed(0)
    writer = ShardWriter(directory, shard_mb)
    for name, shape in _tensor_shapes(cfg):
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        writer.add(name, tensor)
    writer.close()
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    save_bpe_tokenizer(directory, vocab)
    return directory
