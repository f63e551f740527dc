"""The pieces under Kimi Linear: the KDA math against transformers' reference functions,
the recurrent-state pool and its slots, the config's spellings, and the planner's sizing."""

from __future__ import annotations

import pytest
import torch

from engine.attention.kda import delta_rule_chunked, delta_rule_step, l2_normalize, short_conv
from engine.kv.recurrent_state import RecurrentStateLayout
from engine.kv.state_pool import RecurrentStatePool, StepStates
from engine.kv.state_slots import StateSlots
from engine.model_files.hybrid_layers import kv_layer_count, recurrent_state_layout
from engine.model_files.model_config import parse_config
from engine.planner.capacity import ResolvedModel, plan

ATOL = 1e-5


def _inputs(n: int, heads: int = 3, key: int = 16, value: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(n, heads, key, generator=gen), torch.randn(n, heads, key, generator=gen)
    v = torch.randn(n, heads, value, generator=gen)
    g = -2 * torch.rand(n, heads, key, generator=gen)
    beta = torch.rand(n, heads, generator=gen)
    state = torch.randn(heads, key, value, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("length", [1, 63, 150])
def test_chunked_and_step_forms_match_transformers(length):
    from transformers.models.kimi_linear.modeling_kimi_linear import (
        chunk_kimi_delta_attention,
        recurrent_kimi_delta_attention,
    )

    q, k, v, g, beta, state = _inputs(length)
    args = [x.unsqueeze(0) for x in (q, k, v, g, beta)]
    want, want_state = chunk_kimi_delta_attention(
        *args, initial_state=state[None], output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    qn, kn = l2_normalize(q) * q.shape[-1] ** -0.5, l2_normalize(k)
    got, got_state = delta_rule_chunked(qn, kn, v, g, beta, state)
    assert (got - want[0]).abs().max() < ATOL and (got_state - want_state[0]).abs().max() < ATOL
    step_state, rows = state[None], []
    for t in range(length):
        row, step_state = delta_rule_step(
            qn[t : t + 1], kn[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], step_state
        )
        rows.append(row)
    assert (torch.cat(rows) - want[0]).abs().max() < ATOL
    _, reference_step = recurrent_kimi_delta_attention(
        *(x[:, :1] for x in args),
        initial_state=state[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    _, first_state = delta_rule_step(qn[:1], kn[:1], v[:1], g[:1], beta[:1], state[None])
    assert (first_state - reference_step).abs().max() < ATOL


def test_short_conv_in_pieces_equals_one_pass():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 20, 6, generator=gen)
    weight = torch.randn(6, 1, 4, generator=gen)
    whole, _ = short_conv(x, torch.zeros(1, 3, 6), weight)
    state, pieces = torch.zeros(1, 3, 6), []
    for start, end in ((0, 2), (2, 3), (3, 11), (11, 20)):  # pieces shorter than the window too
        out, state = short_conv(x[:, start:end], state, weight)
        pieces.append(out)
    assert torch.allclose(torch.cat(pieces, dim=1), whole, atol=1e-6)
    assert torch.equal(state, x[:, -3:])


def test_slots_are_handed_out_and_back_once():
    slots = StateSlots(2)
    a, b = slots.allocate(), slots.allocate()
    assert {a, b} == {0, 1} and slots.num_free == 0
    with pytest.raises(RuntimeError):
        slots.allocate()
    slots.release(a)
    with pytest.raises(RuntimeError):
        slots.release(a)
    assert slots.allocate() == a


class _Seq:
    def __init__(self, slot: int, computed: int):
        self.state_slot, self.num_computed_tokens = slot, computed


class _Item:
    def __init__(self, slot: int, computed: int, tokens: int):
        self.seq, self.num_tokens, self.draft = _Seq(slot, computed), tokens, []


def test_a_step_zeroes_only_the_slots_of_fresh_sequences():
    layout = RecurrentStateLayout(
        2, num_heads=2, key_dim=4, value_dim=4, conv_channels=6, conv_width=4
    )
    pool = RecurrentStatePool(layout, 3, torch.float32)
    pool.conv.fill_(1.0)
    pool.recurrent.fill_(1.0)
    assert pool.nbytes == RecurrentStatePool.bytes_for(layout, 3, torch.float32)
    step = StepStates.for_batch(pool, [_Item(2, 0, 5), _Item(0, 7, 1), _Item(1, 3, 1)])
    assert pool.recurrent[:, 2].abs().sum() == 0 and pool.conv[:, 2].abs().sum() == 0
    assert bool((pool.recurrent[:, :2] == 1).all())  # continuing sequences keep theirs
    tokens, slots = step.decode_rows()
    assert tokens.tolist() == [5, 6] and slots.tolist() == [0, 1]
    assert step.prefill_runs() == [(0, 5, 2)]


def released_kimi_linear_config() -> dict:
    """Kimi-Linear-48B-A3B's shape as its release writes it (transformers' KimiLinearConfig
    defaults): 27 layers, every fourth MLA from the fourth and the last (1-based)."""
    full = [4, 8, 12, 16, 20, 24, 27]
    return dict(
        architectures=["KimiLinearForCausalLM"],
        model_type="kimi_linear",
        vocab_size=163840,
        hidden_size=2304,
        intermediate_size=9216,
        moe_intermediate_size=1024,
        num_hidden_layers=27,
        num_attention_heads=32,
        num_key_value_heads=32,
        kv_lora_rank=512,
        q_lora_rank=None,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_experts=256,
        num_experts_per_token=8,
        num_shared_experts=1,
        moe_renormalize=True,
        num_expert_group=1,
        topk_group=1,
        routed_scaling_factor=2.446,
        first_k_dense_replace=1,
        model_max_length=1048576,
        linear_attn_config={
            "full_attn_layers": full,
            "kda_layers": [i for i in range(1, 28) if i not in full],
            "head_dim": 128,
            "num_heads": 32,
            "short_conv_kernel_size": 4,
        },
    )


def test_the_released_config_reads_into_the_engines_spellings():
    cfg = parse_config(released_kimi_linear_config())
    assert cfg.architecture == "KimiLinearForCausalLM"
    assert cfg.max_position_embeddings == 1048576
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]) == (
        256,
        8,
        1,
    )
    assert cfg["layer_types"][3] == "full_attention" and cfg["layer_types"][0] == "linear_attention"
    assert cfg["mlp_layer_types"][:2] == ["dense", "sparse"]
    assert kv_layer_count(cfg) == 7


def test_the_planner_sizes_mla_kv_for_seven_layers_and_a_state_per_request():
    cfg = parse_config(released_kimi_linear_config())
    layout = recurrent_state_layout(cfg)
    assert layout.num_layers == 20
    # Per KDA layer: 32 heads x 128 x 128 float32, and 3 x 4096 channels x 3 inputs in BF16.
    per_request = 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 3 * 2)
    assert layout.bytes_per_sequence(2) == per_request == 43_417_600
    result = plan(ResolvedModel("kimi-linear", cfg, "config.json"))
    assert result["kv_layout"]["layers"] == 7
    assert result["kv_bytes_per_token"] == {"bf16": 7 * 576 * 2, "fp8_e4m3": 7 * 576}
    # Per GPU: KDA's 32 heads (and their convolution channels) split over the TP ranks.
    tp = result["tp"]
    per_gpu = per_request // tp
    assert result["recurrent_state_bytes_per_request"] == per_gpu
    budget, context = result["kv_budget_bytes_per_gpu"], result["context_tokens"]
    assert result["concurrent_requests"]["fp8_e4m3"] == budget // (context * 7 * 576 + per_gpu)
