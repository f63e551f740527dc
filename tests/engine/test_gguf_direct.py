"""Weights read straight from a GGUF file: blocks kept packed, no float32 folder.

A folder whose `model.gguf` links a GGUF file loads its weights from that file
(engine/models/gguf_loader.py). Against the float32 folder the same file
converts to (the path every GGUF took before), with the grid kernel in use:
a file whose fused layers hold one block type gives bit-identical logits (the
same codes and half scales reach the same kernel); a file that mixes types in
one fused layer (Q4_1 q/k beside a Q8_0 v, as Q4_K_M files do) packs there
too, where the float32 route left the layer dense; a weight's dense copy
never exists.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import LLM
from engine.cpu_kernels.library import unavailable
from engine.errors import CheckpointError
from engine.layers.cpu_grid_weights import grid_weight_of
from engine.model_files.gguf_convert import convert_gguf
from engine.models.loader import GGUF_WEIGHTS
from tests.engine.gguf_fixtures import tiny_llama, tiny_tokenizer, write_tiny_gguf

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
PROMPT = list(range(5, 40))
LAYERS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _types(mixed: bool) -> dict[str, Q]:
    types = {f"blk.{i}.{name}.weight": Q.Q4_1 for i in range(2) for name in LAYERS}
    types.update({f"blk.{i}.ffn_down.weight": Q.Q4_0 for i in range(2)})
    types.update({"output.weight": Q.Q8_0, "token_embd.weight": Q.Q8_0})
    if mixed:
        types["blk.1.attn_v.weight"] = Q.Q8_0
    return types


def _folders(root, mixed: bool):
    """(the float32 folder the file converts to, a folder reading the file directly)."""
    tokenizer = tiny_tokenizer()
    model = tiny_llama(tokenizer.get_vocab_size(), tie_word_embeddings=False)
    gguf = root / "model.q.gguf"
    write_tiny_gguf(gguf, model, tokenizer, _types(mixed))
    converted = convert_gguf(gguf, root / "converted")
    direct = root / "direct"
    shutil.copytree(converted, direct, ignore=shutil.ignore_patterns("*.safetensors"))
    (direct / GGUF_WEIGHTS).symlink_to(gguf)
    return converted, direct


def _llm(folder) -> LLM:
    return LLM(str(folder), dtype="bfloat16", kv_cache_dtype="bf16")


def _dense_layers(llm: LLM) -> list[str]:
    modules = llm.engine.model.named_modules()
    return [name for name, m in modules if hasattr(m, "method") and grid_weight_of(m) is None]


def test_a_file_read_directly_computes_what_its_float32_folder_computes(tmp_path):
    converted, direct = _folders(tmp_path, mixed=False)
    through_folder, from_file = _llm(converted), _llm(direct)
    assert _dense_layers(through_folder) == _dense_layers(from_file) == []
    assert torch.equal(through_folder.prompt_logits(PROMPT), from_file.prompt_logits(PROMPT))
    for module in from_file.engine.model.modules():
        if grid_weight_of(module) is not None:
            assert module.weight.numel() == 0  # no dense copy was ever made
    # The Q8_0 embedding stays in its blocks too, looked up row by row: same logits.
    embedding = from_file.engine.model.model.embed_tokens
    assert embedding.grid is not None and embedding.weight.numel() == 0
    assert through_folder.engine.model.model.embed_tokens.grid is None
    ids = torch.tensor([[0, 5, 7], [embedding.vocab_size - 1, 3, 3]])
    dense = through_folder.engine.model.model.embed_tokens(ids)
    assert torch.equal(embedding(ids), dense) and embedding(ids).dtype == torch.bfloat16
    with pytest.raises(IndexError):
        embedding(torch.tensor([embedding.vocab_size]))


def test_a_fused_layer_of_mixed_block_types_packs_when_read_directly(tmp_path):
    converted, direct = _folders(tmp_path, mixed=True)
    through_folder, from_file = _llm(converted), _llm(direct)
    assert _dense_layers(through_folder) == ["model.layers.1.self_attn.qkv_proj"]
    assert _dense_layers(from_file) == []
    qkv = grid_weight_of(from_file.engine.model.model.layers[1].self_attn.qkv_proj)
    assert qkv.bits == 8  # Q4_1 codes kept as 8-bit codes beside the Q8_0 ones
    # The same values either way: the packed model agrees with the dense-qkv one as two
    # int8-activation evaluations of one model do (one layer's activations rounded apart).
    difference = (through_folder.prompt_logits(PROMPT) - from_file.prompt_logits(PROMPT)).abs()
    assert difference.max().item() < 0.05


def test_a_float32_engine_reads_the_blocks_dequantized(tmp_path):
    """No grid kernel in float32: every tensor is dequantized, as the folder holds it."""
    converted, direct = _folders(tmp_path, mixed=True)
    exact = LLM(str(converted), dtype="float32").prompt_logits(PROMPT)
    assert torch.equal(LLM(str(direct), dtype="float32").prompt_logits(PROMPT), exact)


def test_a_moved_file_is_a_clear_error(tmp_path):
    _, direct = _folders(tmp_path, mixed=False)
    (tmp_path / "model.q.gguf").rename(tmp_path / "elsewhere.gguf")
    with pytest.raises(CheckpointError, match="which is gone"):
        LLM(str(direct), dtype="bfloat16")
