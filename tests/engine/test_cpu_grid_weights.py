"""Packed 4-bit CPU weights: exact for grid weights, refused for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.layers.cpu_grid_weights import MAX_PACKED_ROWS, pack_grid_weights, pack_if_on_grid
from engine.layers.linear_methods import MethodLinear, grid_weight_of
from engine.model_store import default_model_dir, is_complete

ROWS, COLS = 48, 128  # 4 groups of 32 per row


def _q4_1_weight(gen: torch.Generator) -> torch.Tensor:
    """Values the way Q4_1 dequantizes: fp16 step and minimum, q in 0..15, per 32."""
    step = (torch.rand(ROWS, COLS // 32, 1, generator=gen) * 0.02 + 1e-3).half().float()
    low = (-torch.rand(ROWS, COLS // 32, 1, generator=gen) * 0.1).half().float()
    q = torch.randint(0, 16, (ROWS, COLS // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 maps a group's minimum to 0 and its maximum to 15
    return (step * q + low).reshape(ROWS, COLS)


def _q8_0_weight(gen: torch.Generator) -> torch.Tensor:
    step = (torch.rand(ROWS, COLS // 32, 1, generator=gen) * 0.01 + 1e-4).half().float()
    q = torch.randint(-127, 128, (ROWS, COLS // 32, 32), generator=gen).float()
    q[..., 0] = 127  # Q8_0's step is the group's absolute maximum / 127
    return (step * q).reshape(ROWS, COLS)


def _bf16_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.float() @ weight.T


@pytest.mark.parametrize("make, grid", [(_q4_1_weight, "4-bit"), (_q8_0_weight, "8-bit")])
def test_grid_weights_pack_and_match_the_dense_product(make, grid):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    weight = make(gen)
    packed = pack_if_on_grid(weight)
    assert packed is not None and packed.grid == grid
    x = torch.randn(3, COLS, generator=gen).bfloat16()
    exact = _bf16_reference(x, weight)
    dense_bf16 = x.float() @ weight.bfloat16().float().T
    got = packed.matmul(x).float()
    # The packed scales are BF16, so the packed product differs from the exact
    # one by BF16 rounding, as the dense BF16 product does: same order of error.
    dense_error = (dense_bf16 - exact).abs().max()
    assert (got - exact).abs().max() <= 4 * dense_error + 1e-3 * exact.abs().max()


@pytest.mark.parametrize(
    "weight",
    [
        torch.randn(ROWS, COLS),  # an ordinary float32 weight
        torch.randn(ROWS, COLS).bfloat16().float(),  # an ordinary BF16 weight
        torch.randn(ROWS, COLS - 16),  # columns not a multiple of the group
        _q4_1_weight(torch.Generator().manual_seed(3))[:-8],  # rows the kernel cannot pack
    ],
)
def test_weights_off_any_grid_stay_dense(weight):
    assert pack_if_on_grid(weight) is None


def test_a_single_off_grid_value_keeps_the_whole_weight_dense():
    weight = _q4_1_weight(torch.Generator().manual_seed(1))
    weight[40, 45] += 1e-3  # past the rows probed first
    assert pack_if_on_grid(weight) is None


def test_packed_linear_uses_packed_rows_then_dense_rows_and_keeps_bias():
    gen = torch.Generator().manual_seed(2)
    linear = MethodLinear(COLS, ROWS, bias=True)
    with torch.no_grad():
        linear.weight.copy_(_q4_1_weight(gen))
        linear.bias.copy_(torch.randn(ROWS, generator=gen))
    plain = nn.Linear(COLS, ROWS, bias=True)
    plain.load_state_dict(linear.state_dict())
    report = pack_grid_weights(linear)
    assert report["4-bit"] == 1 and report["dense"] == 0
    linear.bfloat16()
    plain.bfloat16()
    for rows in (1, MAX_PACKED_ROWS, MAX_PACKED_ROWS + 1, 16):
        x = torch.randn(rows, COLS, generator=gen).bfloat16()
        got, want = linear(x).float(), plain(x).float()
        assert got.shape == (rows, ROWS)
        assert torch.allclose(got, want, atol=0.05, rtol=0.02), rows


@pytest.mark.skipif(
    not is_complete(default_model_dir()), reason="default model not pulled: resident models pull"
)
def test_the_default_model_packs_whole_and_exactly(monkeypatch):
    """BF16 activations (torch's int4 kernel, no C layer kernels): packing is exact, so
    greedy text equals the dense BF16 model's."""
    import engine.model_stack as engine_module
    from engine import LLM, SamplingParams

    monkeypatch.setattr(engine_module, "cpu_kernels_unavailable", lambda: "off for this test")
    packed = LLM(str(default_model_dir()), dtype="bfloat16", kv_cache_dtype="bf16")
    assert packed.engine.cpu_kernel == "bf16"
    layers = [m for m in packed.engine.model.modules() if isinstance(m, nn.Linear)]
    assert all(grid_weight_of(m) is not None for m in layers)
    assert grid_weight_of(packed.engine.model.lm_head).grid == "8-bit"  # the Q8_0 embedding
    params = SamplingParams(max_tokens=24, temperature=0)
    prompt = "The capital of France is"
    with_packing = packed.generate([prompt], params)[0].outputs[0].token_ids
    # --deterministic never packs: the dense BF16 model, for comparison.
    dense = LLM(
        str(default_model_dir()), dtype="bfloat16", kv_cache_dtype="bf16", deterministic=True
    )
    assert not any(grid_weight_of(m) is not None for m in dense.engine.model.modules())
    without = dense.generate([prompt], params)[0].outputs[0].token_ids
    assert with_packing == without


@pytest.mark.skipif(
    not is_complete(default_model_dir()), reason="default model not pulled: resident models pull"
)
def test_the_default_model_with_int8_activations_predicts_as_float32_does():
    """int8 activations round more than BF16 ones: greedy text may part from the dense
    model's at a near-tie, so this checks next-token agreement with float32 instead."""
    from engine import LLM
    from engine.cpu_kernels.library import unavailable

    if unavailable():
        pytest.skip(f"CPU kernels: {unavailable()}")
    fast = LLM(str(default_model_dir()), dtype="bfloat16", kv_cache_dtype="bf16", cpu_kernel="int8")
    assert fast.engine.cpu_kernel == "int8"
    assert grid_weight_of(fast.engine.model.lm_head).grid == "8-bit"
    # dense copies dropped, except the embedding the tied output head shares
    assert fast.engine.model.model.layers[0].mlp.down_proj.weight.numel() == 0
    assert fast.engine.model.model.embed_tokens.weight.numel() == 49152 * 576
    reference = LLM(str(default_model_dir()), dtype="float32", kv_cache_dtype="bf16")
    text = Path(__file__).read_text()[:3000]
    ids = reference.engine.tokenizer.encode(text)[:400]
    want = reference.prompt_logits(ids).argmax(-1)
    got = fast.prompt_logits(ids, decode_last=40).argmax(-1)  # prefill rows and decode steps
    agreement = float((got == want).float().mean())
    print(f"\n[default model] int8 activations: top-1 agreement with float32 = {agreement:.3f}")
    assert agreement >= 0.93
