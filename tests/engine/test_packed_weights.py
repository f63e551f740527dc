"""FP8 block-scaled and INT4 checkpoints kept in their own precision, against dequantizing them.

The tiny Kimi (DeepSeek V3) and GLM-4.5 MoE checkpoints are written in the
real layouts (engine/devtools/testing/quantized.py). Loaded packed, every quantized
linear layer holds the checkpoint's bytes and multiplies by dequantizing a
chunk of rows at a time; loaded with `keep_packed=False` the loader
dequantizes them into dense float32 layers. Both compute from the same
float32 values, so layer outputs agree to float32 summation order and the
model's greedy tokens are equal.
"""

from __future__ import annotations

import pytest
import torch

from engine.collectives import parallel
from engine.devtools.testing.checkpoints import make_checkpoint
from engine.layers.linear import FusedLinear, RowSlice
from engine.layers.linear_methods import MethodLinear, describe_methods, model_weight_bytes
from engine.layers.packed_methods import Fp8BlockMethod, is_packed_method
from engine.models.loader import load_model
from engine.weights.fp8_block_format import dequantize_fp8_block, quantize_fp8_block
from engine.weights.int4_packed import dequantize_packed_int4, pack_int4
from engine.weights.meta_init import materialize_parameters
from engine.weights.packed_pieces import Fp8Piece, Int4Piece

CASES = [
    ("kimi_k2", "fp8_block"),
    ("kimi_k2", "int4_experts"),
    ("glm4_moe", "fp8_block"),
    ("glm4_moe", "int4_experts"),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def both(request, tmp_path_factory):
    family, quantization = request.param
    folder = tmp_path_factory.mktemp(f"{family}-{quantization}")
    tiny = make_checkpoint(family, folder / "model", quantization=quantization)
    cpu = torch.device("cpu")
    packed, _, _ = load_model(tiny.path, torch.float32, cpu)
    dense, _, _ = load_model(tiny.path, torch.float32, cpu, keep_packed=False)
    return quantization, packed, dense


def test_quantized_layers_keep_their_checkpoint_form(both):
    quantization, packed, dense = both
    methods = describe_methods(packed)
    name = "fp8-block" if quantization == "fp8_block" else "int4-group"
    assert methods.get(name, 0) >= 16
    assert set(describe_methods(dense)) == {"dense"}
    for module in packed.modules():
        if isinstance(module, MethodLinear) and is_packed_method(module.method):
            kind = torch.float8_e4m3fn if name == "fp8-block" else torch.bfloat16
            assert module.weight.dtype == kind
            if name == "int4-group":
                assert module.weight.numel() == 0  # no dense copy at all


def test_packed_layers_compute_what_dequantized_layers_compute(both):
    _, packed, dense = both
    generator = torch.Generator().manual_seed(0)
    dense_modules = dict(dense.named_modules())
    compared = 0
    for name, module in packed.named_modules():
        if isinstance(module, MethodLinear) and is_packed_method(module.method):
            x = torch.randn(5, module.in_features, generator=generator)
            # Same float32 weights; F.linear over row chunks vs the whole matrix.
            torch.testing.assert_close(module(x), dense_modules[name](x), rtol=1e-6, atol=1e-6)
            compared += 1
    assert compared >= 16


def test_int4_experts_hold_under_a_third_of_bf16(both):
    quantization, packed, _ = both
    if quantization != "int4_experts":
        pytest.skip("INT4 only")
    for module in packed.modules():
        if isinstance(module, MethodLinear) and is_packed_method(module.method):
            bf16 = module.in_features * module.out_features * 2
            # 4 bits per weight plus one bf16 scale per 32: 0.28x of BF16.
            assert module.weight_bytes() < 0.3 * bf16


def test_fp8_pieces_slice_rows_and_columns_inside_blocks():
    """A tensor-parallel or fused-shard slice that starts inside a 128x128 block keeps
    exactly its own scales."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(300, 260, generator=generator)
    values, scale_inv = quantize_fp8_block(weight)
    full = dequantize_fp8_block(values, scale_inv, dtype=torch.float32)
    piece = Fp8Piece.from_checkpoint(values, scale_inv, (128, 128))
    part = piece.narrow(0, 100, 90).narrow(1, 70, 150)  # rows 100..189, columns 70..219
    assert (part.row_offset, part.col_offset) == (100, 70)
    assert torch.equal(part.scales, scale_inv[0:2, 0:2])  # the grid blocks it crosses
    assert part.narrow(0, 40, 50).row_offset == 12  # row 140: row 12 of the second block
    restored = part.values.float() * part.row_scales().repeat_interleave(128, 1)[:, 70:220]
    torch.testing.assert_close(restored, full[100:190, 70:220], rtol=0, atol=0)


def _fp8_tensor(rows: int, cols: int, generator) -> tuple[Fp8Piece, torch.Tensor]:
    """A checkpoint tensor as the loader hands it over, and its dequantized weight."""
    values, scale_inv = quantize_fp8_block(torch.randn(rows, cols, generator=generator))
    dense = dequantize_fp8_block(values, scale_inv, dtype=torch.float32)
    return Fp8Piece.from_checkpoint(values, scale_inv, (128, 128)), dense


def _fused_fp8_layer(shards: dict, tensors: dict, order: list[str]) -> FusedLinear:
    layer = FusedLinear(200, shards)
    Fp8BlockMethod((128, 128), 0).install(layer)
    materialize_parameters(layer, torch.device("cpu"))
    for shard in order:
        layer.load_shard(shard, "weight", tensors[shard])
    return layer


def _check_exact(layer: FusedLinear, want: torch.Tensor, generator) -> None:
    rows = slice(0, layer.out_features)
    assert torch.equal(layer.method.dequantize(layer, rows, torch.float32), want)
    for some in (slice(3, 150), slice(130, 131)):  # rows inside blocks too
        assert torch.equal(layer.method.dequantize(layer, some, torch.float32), want[some])
    x = torch.randn(12, 200, generator=generator)  # kernel or chunked path, both float32
    torch.testing.assert_close(layer(x), x @ want.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x[:2]), x[:2] @ want.T, rtol=1e-5, atol=1e-5)


def test_fp8_layers_whose_pieces_start_on_blocks_hold_the_checkpoint_grid():
    """Fused shards of 256 and 100 rows: each starts on a block of its tensor and at a
    layer row on a block, so the layer keeps the grid, 4 bytes per 128x128 weights."""
    generator = torch.Generator().manual_seed(3)
    (a, dense_a), (b, dense_b) = _fp8_tensor(256, 200, generator), _fp8_tensor(100, 200, generator)
    layer = _fused_fp8_layer({"a": 256, "b": 100}, {"a": a, "b": b}, ["b", "a"])
    assert layer.method.scale_rows == 128 and layer.weight_scale.shape == (3, 2)
    assert torch.equal(layer.weight_scale, torch.cat([a.scales, b.scales]))
    assert layer.weight_bytes() == 356 * 200 + 3 * 2 * 4
    _check_exact(layer, torch.cat([dense_a, dense_b]), generator)


@pytest.mark.parametrize(
    "case",
    ["shard_at_row_100", "shard_at_row_100_first", "rank_slice_inside_a_block"],
)
def test_an_fp8_layer_with_a_piece_inside_a_block_holds_row_scales(case):
    """A shard at layer row 100, loaded after (the grid rows loaded so far are expanded)
    or before the aligned one, or a rank's rows 64..213 of a tensor: per-row scales."""
    generator = torch.Generator().manual_seed(4)
    if case == "rank_slice_inside_a_block":
        piece, dense = _fp8_tensor(300, 200, generator)
        layer = _fused_fp8_layer({"a": RowSlice(300, 64, 150)}, {"a": piece}, ["a"])
        want = dense[64:214]
    else:
        (a, dense_a), (b, dense_b) = (_fp8_tensor(100, 200, generator) for _ in range(2))
        order = ["a", "b"] if case == "shard_at_row_100" else ["b", "a"]
        layer = _fused_fp8_layer({"a": 100, "b": 100}, {"a": a, "b": b}, order)
        want = torch.cat([dense_a, dense_b])
    assert layer.method.scale_rows == 1
    assert layer.weight_scale.shape == (layer.out_features, 2)
    _check_exact(layer, want, generator)


def _release_bytes(folder) -> int:
    """The checkpoint's bytes with unquantized tensors at BF16, as releases store them
    (the generator writes them in float32)."""
    from safetensors import safe_open

    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                kept = name.endswith("_scale_inv") or tensor.dtype == torch.float8_e4m3fn
                total += tensor.numel() * (tensor.element_size() if kept else 2)
    return total


def test_tiny_kimi_fp8_holds_within_five_percent_of_its_checkpoint(tmp_path):
    """Experts of intermediate 128, so gate and up start on blocks: every FP8 layer
    holds the checkpoint's grid but the fused latent projection (q_a then kv_a: kv_a
    starts inside a block of rows, so it holds per-row scales), and what is left over
    the checkpoint's bytes is kv_b_proj, which the loader keeps dense in BF16 (1 byte
    more per weight; attention reads it), and the float32 routers (about 3% at these
    sizes; 6% with the suite's experts of 32, whose fused gate/up shards start inside
    a block and hold per-row scales)."""
    tiny = make_checkpoint(
        "kimi_k2", tmp_path / "kimi", quantization="fp8_block", moe_intermediate_size=128
    )
    model, _, _ = load_model(tiny.path, torch.bfloat16, torch.device("cpu"))
    fp8 = {n: m for n, m in model.named_modules() if getattr(m, "method", None) is not None}
    fp8 = {n: m for n, m in fp8.items() if m.method.name == "fp8-block"}
    latent = {n for n in fp8 if n.endswith("fused_qkv_a_proj")}
    assert len(latent) == 2 and all(fp8[n].method.scale_rows == 1 for n in latent)
    assert len(fp8) >= 18 and all(
        m.method.scale_rows == 128 for n, m in fp8.items() if n not in latent
    )
    assert model_weight_bytes(model) <= 1.05 * _release_bytes(tiny.path)


def test_the_planner_prices_fp8_layers_at_what_the_engine_holds(tmp_path):
    """GLM-4.5 with every fused shard on a 128-row block (q, k, v of 128 rows; gate and
    up of 128): the packed layers hold exactly the planner's FP8 price for them."""
    from engine.model_files.model_config import load_config
    from engine.planner.weight_bytes import num_experts, scheme_from_config, weight_groups

    tiny = make_checkpoint(
        "glm4_moe",
        tmp_path / "glm",
        quantization="fp8_block",
        head_dim=32,
        num_key_value_heads=4,
        moe_intermediate_size=128,
    )
    model, _, _ = load_model(tiny.path, torch.bfloat16, torch.device("cpu"))
    held = sum(
        m.weight_bytes()
        for m in model.modules()
        if isinstance(m, MethodLinear) and m.method.name == "fp8-block"
    )
    cfg = load_config(tiny.path)
    scheme, experts = scheme_from_config(cfg), num_experts(cfg) > 0
    priced = sum(
        scheme.group_bytes(group, experts)
        for group in weight_groups(cfg, include_mtp=False)
        if scheme.quantizes(group, experts)
    )
    assert scheme.name == "fp8" and held == priced


def test_int4_pieces_slice_on_groups_only():
    generator = torch.Generator().manual_seed(2)
    values = torch.randint(-8, 8, (48, 128), generator=generator)
    scales = torch.rand(48, 4, generator=generator).to(torch.bfloat16)
    piece = Int4Piece(pack_int4(values), scales, 128, 32)
    part = piece.narrow(1, 32, 64).narrow(0, 8, 16)
    expected = dequantize_packed_int4(pack_int4(values), scales, (48, 128), 32, torch.float32)
    got = dequantize_packed_int4(part.packed, part.scales, (16, 64), 32, torch.float32)
    torch.testing.assert_close(got, expected[8:24, 32:96], rtol=0, atol=0)
    with pytest.raises(ValueError, match="INT4 groups of 32"):
        piece.narrow(1, 16, 32)


def test_a_rank_whose_columns_cut_an_int4_group_dequantizes_that_layer(tmp_path):
    """TP 2 over experts of 32 columns leaves 16 per rank: not a whole group."""
    tiny = make_checkpoint("kimi_k2", tmp_path / "kimi", quantization="int4_experts")
    parallel.set_layout(parallel.ParallelLayout(2, 1))
    try:
        model, _, _ = load_model(tiny.path, torch.float32, torch.device("cpu"))
    finally:
        parallel.set_layout(parallel.ParallelLayout())
    expert = model.model.layers[1].mlp.experts[0]
    assert expert.gate_up_proj.method.name == "int4-group"  # rows split: still packed
    assert expert.down_proj.method.name == "dense"  # 16 of 32 columns: dequantized


@pytest.mark.parametrize("family", ["kimi_k2", "glm4_moe"])
def test_the_engine_serves_packed_as_it_serves_dequantized(tmp_path, family):
    """Greedy tokens through the whole engine, and the weight bytes it reports."""
    from engine import LLM, SamplingParams

    tiny = make_checkpoint(family, tmp_path / "m", quantization="int4_experts")
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[5, 9, 17, 33, 2, 60, 7], [40, 41, 42]]
    runs = {}
    for form in ("packed", "dequantized"):
        llm = LLM(str(tiny.path), dtype="float32", kv_memory=0.01, quantized_weights=form)
        tokens = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
        runs[form] = (tokens, llm.stats())
    assert runs["packed"][0] == runs["dequantized"][0]
    packed_stats, dense_stats = runs["packed"][1], runs["dequantized"][1]
    assert packed_stats["linear_methods"]["int4-group"] == 16
    assert packed_stats["weight_bytes"] < dense_stats["weight_bytes"]


def test_the_cpu_kernel_choice_reaches_packed_int4_layers(tmp_path):
    """`--cpu-kernel bf16` multiplies BF16 activations exactly, as it does for grid
    weights; the default quantizes them to int8 per group where the kernels run."""
    from engine import LLM
    from engine.cpu_kernels import library
    from engine.layers.packed_methods import Int4GroupMethod

    tiny = make_checkpoint("kimi_k2", tmp_path / "m", quantization="int4_experts")

    def activations(llm):
        return {
            m.method.cpu_activations
            for m in llm.engine.model.modules()
            if isinstance(getattr(m, "method", None), Int4GroupMethod)
        }

    exact = LLM(str(tiny.path), dtype="bfloat16", kv_memory=0.01, cpu_kernel="bf16")
    assert exact.engine.cpu_kernel == "bf16" and activations(exact) == {"float"}
    default = LLM(str(tiny.path), dtype="bfloat16", kv_memory=0.01)
    expected = "bf16" if library.unavailable() else "int8"
    assert default.engine.cpu_kernel == expected
    assert activations(default) == {"float" if expected == "bf16" else "int8"}
