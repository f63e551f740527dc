"""Each rank loads only its slices: shapes, values against the checkpoint, experts dealt.

Loading needs no process group (no collective runs while loading), so these
set the layout of one rank of a larger group in this process.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from engine.collectives import parallel
from engine.devtools.testing.checkpoints import build_glm4_moe, tiny_llama
from engine.errors import EngineError
from engine.models.loader import checkpoint_files, load_model


def _checkpoint(folder) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in checkpoint_files(folder):
        tensors.update(load_file(str(file)))
    return tensors


@pytest.fixture
def as_rank():
    def set_rank(size: int, rank: int, expert_parallel: bool = False) -> None:
        parallel.set_layout(parallel.ParallelLayout(size, rank, expert_parallel))

    yield set_rank
    parallel.set_layout(parallel.ParallelLayout())


def test_a_rank_holds_its_heads_and_its_slice_of_the_mlp(tmp_path, as_rank):
    folder = tiny_llama(tmp_path / "llama", num_attention_heads=4, num_key_value_heads=2)
    ckpt = _checkpoint(folder)
    as_rank(4, 3)
    model, _, _ = load_model(folder, torch.float32, torch.device("cpu"))
    attn = model.model.layers[0].self_attn
    layer = "model.layers.0."
    q, k = ckpt[layer + "self_attn.q_proj.weight"], ckpt[layer + "self_attn.k_proj.weight"]
    head = 16  # 64 hidden / 4 heads
    # Rank 3 of 4: query head 3; KV head 1 (2 KV heads, each on 2 ranks).
    assert (attn.num_heads, attn.num_kv_heads) == (1, 1)
    rows = attn.qkv_proj.weight
    assert torch.equal(rows[:head], q[3 * head : 4 * head])
    assert torch.equal(rows[head : 2 * head], k[head : 2 * head])
    o = ckpt[layer + "self_attn.o_proj.weight"]
    assert torch.equal(attn.o_proj.weight, o[:, 3 * head : 4 * head])
    mlp = model.model.layers[0].mlp
    down = ckpt[layer + "mlp.down_proj.weight"]
    assert torch.equal(mlp.down_proj.weight, down[:, 96:128])
    # Vocabulary rows 240..319 of 320, tied with the head.
    embed = ckpt["model.embed_tokens.weight"]
    assert torch.equal(model.model.embed_tokens.weight, embed[240:320])
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_the_vocabulary_pads_to_a_multiple_of_the_ranks(tmp_path, as_rank):
    folder = tiny_llama(tmp_path / "llama", vocab_size=321)
    embed = _checkpoint(folder)["model.embed_tokens.weight"]
    as_rank(2, 1)
    model, _, _ = load_model(folder, torch.float32, torch.device("cpu"))
    rows = model.model.embed_tokens.weight
    assert rows.shape[0] == 161
    assert torch.equal(rows[:160], embed[161:321])
    assert not rows[160].any()  # padding


def test_expert_parallel_ranks_hold_whole_experts_and_read_no_others(tmp_path, as_rank):
    folder = build_glm4_moe(tmp_path / "moe")
    ckpt = _checkpoint(folder)
    as_rank(2, 1, expert_parallel=True)
    model, _, _ = load_model(folder, torch.float32, torch.device("cpu"))
    moe = model.model.layers[1].mlp
    names = {n for n, _ in model.named_parameters()}
    assert moe.local == [e % 2 == 1 for e in range(8)]
    assert not any(".experts.0." in n or ".experts.2." in n for n in names)
    down = ckpt["model.layers.1.mlp.experts.3.down_proj.weight"]
    assert torch.equal(moe.experts[3].down_proj.weight, down)  # whole
    shared = ckpt["model.layers.1.mlp.shared_experts.down_proj.weight"]
    assert torch.equal(moe.shared_experts.down_proj.weight, shared[:, 16:])  # split


def test_a_row_parallel_bias_is_added_once(tmp_path, as_rank):
    folder = tiny_llama(tmp_path / "llama", attention_bias=True)
    bias = _checkpoint(folder)["model.layers.0.self_attn.o_proj.bias"]
    held = []
    for rank in range(2):
        as_rank(2, rank)
        model, _, _ = load_model(folder, torch.float32, torch.device("cpu"))
        held.append(model.model.layers[0].self_attn.o_proj.bias.detach().clone())
    assert torch.equal(held[0], bias)
    assert not held[1].any()


def test_heads_that_do_not_split_are_refused_by_name(tmp_path, as_rank):
    folder = tiny_llama(tmp_path / "llama")  # 4 heads
    as_rank(8, 0)
    with pytest.raises(EngineError, match=r"attention heads \(4\) does not split over 8"):
        load_model(folder, torch.float32, torch.device("cpu"))


def test_per_head_kv_scales_follow_the_rank_heads(as_rank):
    from engine.kv.scales import _rank_heads

    scales = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # 2 layers x 2 KV heads
    as_rank(2, 1)
    assert torch.equal(_rank_heads(scales), scales[:, 1:2])
    as_rank(4, 1)  # 2 heads over 4 ranks: ranks 0 and 1 hold head 0
    assert torch.equal(_rank_heads(scales), scales[:, 0:1])
    assert torch.equal(_rank_heads(scales[:, 0]), scales[:, 0])  # per layer: unchanged
