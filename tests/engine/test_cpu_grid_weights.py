"""Packed 4-bit CPU weights: exact for grid weights, refused for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from engine.layers.cpu_grid_weights import (
    MAX_PACKED_ROWS,
    grid_weight_of,
    pack_grid_weights,
    pack_if_on_grid,
)
from engine.layers.linear_methods import MethodLinear
from engine.model_files.store import default_model_dir, is_complete

ROWS, COLS = 48, 128  # 4 groups of 32 per row


def _q4_1_grid(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(q, step, low) the way Q4_1 writes them: fp16 step and minimum, q in 0..15, per 32."""
    step = (torch.rand(ROWS, COLS // 32, 1, generator=gen) * 0.02 + 1e-3).half().float()
    low = (-torch.rand(ROWS, COLS // 32, 1, generator=gen) * 0.1).half().float()
    q = torch.randint(0, 16, (ROWS, COLS // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 maps a group's minimum to 0 and its maximum to 15
    return q, step, low


def _q8_0_grid(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """(q, step, 0): fp16 step, q in -127..127, per 32."""
    step = (torch.rand(ROWS, COLS // 32, 1, generator=gen) * 0.01 + 1e-4).half().float()
    q = torch.randint(-127, 128, (ROWS, COLS // 32, 32), generator=gen).float()
    q[..., 0] = 127  # Q8_0's step is the group's absolute maximum / 127
    return q, step, torch.zeros_like(step)


def _weight(q: torch.Tensor, step: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    return (step * q + low).reshape(ROWS, COLS)


def _q4_1_weight(gen: torch.Generator) -> torch.Tensor:
    return _weight(*_q4_1_grid(gen))


# BF16's unit roundoff: round-to-nearest moves a value by at most 2^-8 of itself.
BF16_U = 2.0**-8
FLOAT32_U = 2.0**-24


def _int4_parts(grid: str, q, step, low) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The 4-bit products torch's kernel runs for a grid weight, each as (the part's exact
    value, sum over what BF16 rounds in it) per weight element, [ROWS, COLS] in float64.

    The kernel computes each value as (n - 8) * scale + zero with n in 0..15 and a BF16
    scale and zero per group (engine/layers/cpu_grid_weights.py): rounding scale and
    zero moves the value by at most BF16_U * (|n - 8| |scale| + |zero|). A 4-bit grid
    is one part (scale step, zero low + 8 step); an 8-bit grid two, its high nibble
    h = floor(q / 16) in -8..7 (scale 16 step, zero 0) and its low nibble l = q - 16h
    in 0..15 (scale step, zero 8 step: (l - 8) step + 8 step).
    """
    q, step, low = (t.double() for t in (q, step, low))

    def part(n, scale, zero):
        value = (n - 8) * scale + zero
        rounded = (n - 8).abs() * scale.abs() + zero.abs()
        return value.reshape(ROWS, COLS), rounded.reshape(ROWS, COLS)

    if grid == "4-bit":
        return [part(q, step, low + 8 * step)]
    high = torch.div(q, 16, rounding_mode="floor")
    return [part(high + 8, 16 * step, 0 * step), part(q - 16 * high, step, 8 * step)]


def _error_bound(x: torch.Tensor, parts) -> torch.Tensor:
    """The most the packed product can differ from x @ weight.T, per output element.

    Per part: its BF16 scale and zero (BF16_U of what they multiply, summed over the
    row with |x|), then float32 work, each well inside FLOAT32_U of the same sum: the
    grid recovered from the float32 weight, the fused dequantization, the float32
    accumulation over COLS terms; then the part's output rounded to BF16 (BF16_U of
    it). An 8-bit grid's two part outputs are added in BF16: one more rounding.
    """
    xa = x.double().abs()
    per_part = []
    for value, rounded in parts:
        exposure = xa @ rounded.T  # sum_k |x_k| (|n - 8| |scale| + |zero|)
        error = (BF16_U + (COLS + 8) * FLOAT32_U) * exposure
        per_part.append(error + BF16_U * ((x.double() @ value.T).abs() + error))
    total = sum(per_part)
    if len(parts) > 1:
        exact = sum(x.double() @ value.T for value, _ in parts)
        total = total + BF16_U * (exact.abs() + total)
    return total


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("make, grid", [(_q4_1_grid, "4-bit"), (_q8_0_grid, "8-bit")])
def test_grid_weights_pack_and_match_the_dense_product(make, grid, seed):
    """torch's int4 kernel (BF16 activations and scales, float32 sums, a BF16 result)
    against the exact product, within what its roundings can cost per element."""
    gen = torch.Generator().manual_seed(seed)
    q, step, low = make(gen)
    weight = _weight(q, step, low)
    packed = pack_if_on_grid(weight)
    assert packed is not None and packed.grid == grid
    x = torch.randn(3, COLS, generator=gen).bfloat16()
    exact = x.double() @ weight.double().T
    parts = _int4_parts(grid, q, step, low)
    assert torch.allclose(sum(value for value, _ in parts), weight.double(), rtol=0, atol=1e-6)
    bound = _error_bound(x, parts)
    error = (packed.matmul(x).double() - exact).abs()
    assert (error <= bound).all(), float((error / bound).max())


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


@pytest.mark.parametrize("make, grid", [(_q4_1_grid, "4-bit"), (_q8_0_grid, "8-bit")])
def test_the_int8_kernel_keeps_a_gguf_grids_half_scales_exactly(make, grid):
    """The int8 kernel stores step and offset in half, as the GGUF block did: they
    come back bit for bit, and the packed values are the checkpoint's."""
    q, step, low = make(torch.Generator().manual_seed(4))
    packed = pack_if_on_grid(_weight(q, step, low), kernel="int8")
    assert packed is not None and packed.grid == grid and packed.scales.dtype == torch.float16
    tiles = packed.scales.float().reshape(ROWS // 16, COLS // 32, 2, 16)
    steps = tiles[:, :, 0].permute(0, 2, 1).reshape(ROWS, COLS // 32, 1)
    assert torch.equal(steps, step)
    if grid == "4-bit":
        offsets = tiles[:, :, 1].permute(0, 2, 1).reshape(ROWS, COLS // 32, 1)
        assert torch.equal(offsets, low)
    assert packed.nbytes == packed.codes.numel() + 2 * packed.scales.numel()


@pytest.mark.parametrize("make", [_q4_1_grid, _q8_0_grid])
def test_a_grid_whose_steps_half_cannot_hold_stays_dense_for_the_int8_kernel(make):
    """Half scales would move such a weight's values: the int8 kernel leaves it dense,
    torch's int4 kernel (BF16 scales within its own bound) still packs it."""
    q, step, low = make(torch.Generator().manual_seed(5))
    step = step * (1 + 2.0**-9)  # off the half grid by a quarter of a half step
    weight = _weight(q, step, low)
    assert pack_if_on_grid(weight, kernel="int8") is None
    assert pack_if_on_grid(weight, kernel="bf16") is not None


@pytest.mark.parametrize("kernel", ["int8", "bf16"])
def test_q4_0_blocks_pack_though_most_groups_never_reach_their_top_level(kernel):
    """llama.cpp's Q4_0 (gguf's own quantizer and dequantizer as the reference): d * (q - 8)
    with the largest magnitude at q = 0, so most groups never reach 7d and their minimum
    and maximum are not the grid's ends. They pack, to the file's values."""
    from gguf import GGMLQuantizationType, quants

    from engine.cpu_kernels.library import unavailable
    from engine.layers.cpu_grid_weights import _four_bit_fit

    if kernel == "int8" and unavailable():
        pytest.skip(f"CPU kernels: {unavailable()}")
    weight = torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(6)) * 0.05
    blocks = quants.quantize(weight.numpy(), GGMLQuantizationType.Q4_0)
    values = torch.from_numpy(quants.dequantize(blocks, GGMLQuantizationType.Q4_0).copy())
    values = values.reshape(ROWS, COLS).float()
    groups = values.reshape(ROWS, -1, 32)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    by_ends = _four_bit_fit(groups, lo, (hi - lo) / 15, lo.abs() + hi.abs())[-1]
    assert by_ends.float().mean() < 0.8  # the min/max reading alone would leave it dense
    packed = pack_if_on_grid(values, kernel)
    assert packed is not None and packed.grid == "4-bit"
    identity = torch.eye(COLS)
    if kernel == "int8":
        # One-hot rows quantize exactly (127 * 1/127): the product returns each column.
        # A few rows at a time: from BF16_MIN_ROWS on, an AMX machine takes BF16 tiles.
        got = torch.cat([packed.matmul(rows, torch.float32) for rows in identity.split(8)])
        assert torch.allclose(got, values.T, rtol=0, atol=2.0**-20)
    else:
        got = packed.matmul(identity.bfloat16()).float()
        amax = groups.abs().amax(-1).repeat_interleave(32, dim=1)  # [ROWS, COLS]
        assert ((got - values.T).abs() <= 2 * BF16_U * amax.T).all()


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
def test_the_default_model_packs_whole_and_agrees_with_its_dense_weights(monkeypatch):
    """BF16 activations (torch's int4 kernel, no C layer kernels). Packing loses nothing
    but the scales' BF16 rounding, the same size as rounding the weights themselves to
    BF16, so the packed products (decode steps: up to MAX_PACKED_ROWS rows) and the dense
    BF16 ones (every layer keeps its weight) are two BF16 evaluations of the float32
    model: their logits must agree as such (tests/engine/agreement.py), on the packed
    run's greedy continuations, teacher-forced; token equality would be luck."""
    from engine import LLM, SamplingParams
    from engine.execution import layer_kernels, weight_packing
    from tests.engine.agreement import (
        DEFAULT_MODEL_DECODED,
        DEFAULT_MODEL_GENERATED,
        DEFAULT_MODEL_PROMPTS,
        assert_bf16_evaluations_agree,
        teacher_forced,
    )

    for module in (weight_packing, layer_kernels):  # the kernel's choice, the layers' ops
        monkeypatch.setattr(module, "cpu_kernels_unavailable", lambda: "off for this test")
    model_dir = str(default_model_dir())
    packed = LLM(model_dir, dtype="bfloat16", kv_cache_dtype="bf16")
    assert packed.engine.cpu_kernel == "bf16"
    layers = [m for m in packed.engine.model.modules() if isinstance(m, nn.Linear)]
    assert all(grid_weight_of(m) is not None for m in layers)
    assert grid_weight_of(packed.engine.model.lm_head).grid == "8-bit"  # the Q8_0 embedding
    params = SamplingParams(max_tokens=DEFAULT_MODEL_GENERATED, temperature=0, ignore_eos=True)
    outputs = packed.generate(DEFAULT_MODEL_PROMPTS, params)
    sequences = [o.prompt_token_ids + o.outputs[0].token_ids for o in outputs]
    with_packing = teacher_forced(packed, sequences, DEFAULT_MODEL_DECODED)
    for layer in layers:  # the same model with its dense BF16 weights at every row count
        layer.method.max_packed_rows = 0
    dense = teacher_forced(packed, sequences, DEFAULT_MODEL_DECODED)
    del packed
    exact_model = LLM(model_dir, dtype="float32", kv_cache_dtype="auto")
    assert not any(grid_weight_of(m) is not None for m in exact_model.engine.model.modules())
    exact = torch.cat([exact_model.prompt_logits(s).float() for s in sequences])
    measured = assert_bf16_evaluations_agree(with_packing, dense, exact)
    print(f"\n[default model] packed and dense BF16: {measured}")
    del exact_model
    # --deterministic never packs: its reductions are fixed row tiles of dense weights.
    fixed = LLM(model_dir, dtype="bfloat16", kv_cache_dtype="bf16", deterministic=True)
    assert not any(grid_weight_of(m) is not None for m in fixed.engine.model.modules())


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


def test_grid_parts_join_their_products_and_share_out_the_bias():
    """A fused layer held as one grid weight per part (formats no one layout holds):
    its product is the parts' products side by side, each with its slice of the bias."""
    from engine.cpu_kernels.library import unavailable
    from engine.layers.cpu_grid_weights import GridParts

    if unavailable():
        pytest.skip(f"CPU kernels: {unavailable()}")
    gen = torch.Generator().manual_seed(9)
    weights = [_weight(*_q4_1_grid(gen)), _weight(*_q8_0_grid(gen))]
    parts = [pack_if_on_grid(w, kernel="int8") for w in weights]
    joined = GridParts(parts)
    bias = torch.randn(2 * ROWS, generator=gen)
    joined.bias = bias
    assert torch.equal(joined.bias, bias) and joined.rows == 2 * ROWS
    x = torch.randn(3, COLS, generator=gen).bfloat16()
    alone = [pack_if_on_grid(w, kernel="int8") for w in weights]
    for part, piece in zip(alone, bias.split(ROWS), strict=True):
        part.bias = piece
    expected = torch.cat([part.matmul(x, torch.float32) for part in alone], dim=-1)
    assert torch.equal(joined.matmul(x, torch.float32), expected)
    assert joined.nbytes == sum(part.nbytes for part in parts)
