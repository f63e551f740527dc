"""llama.cpp's K-quants (Q4_K, Q5_K, Q6_K) multiplied by the CPU int8 grid kernel, exactly.

gguf-py cannot quantize K-quants, so the blocks are random bytes with sane scales,
and gguf's own dequantizer is the reference: the kernel must multiply the values it
computes. Product bounds, per output element (u = 2^-24, float32's unit roundoff):
- int8 activations: x_k becomes q_k dx with q_k = round(x_k 127 / m), dx = m / 127 for
  m the group's max |x|; with the roundings of 127 / m, the product and dx, |x_k - q_k
  dx| <= dx / 2 + 5 m u, weighed by |w_k|;
- float32: every group adds two terms (its codes' integer dot times step dx,
  its offset times dx sum(q)) through a rounded scale and an fma, so the sum is off by
  at most (2 G + 4) u times the sum of the terms' magnitudes, each at most sum over the
  group of |x_k|' (|step u_k| + |offset|) with |x_k|' = |x_k| + dx (Q6_K: |w_k|).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from transformers import LlamaConfig, LlamaForCausalLM

from engine import LLM
from engine.cpu_kernels.grid_matmul import GridFormat, grid_dequantize, grid_gather_rows
from engine.cpu_kernels.library import unavailable
from engine.layers.cpu_grid_weights import (
    MAX_PACKED_ROWS,
    GridMethod,
    GridWeight,
    grid_weight_of,
)
from engine.layers.cpu_matrix_path import BF16, use_matrix_path
from engine.layers.cpu_moe_experts import CpuMoeExperts
from engine.layers.layer_ops import CPU_LAYER_OPS
from engine.layers.moe import SparseMoE
from engine.layers.moe_routing import RoutingConfig
from engine.model_files.gguf_convert import convert_gguf
from engine.models.cpu_decode_step import FusedDecode
from engine.models.decoder import GatedMLP
from engine.models.loader import GGUF_WEIGHTS
from engine.weights import gguf_blocks
from engine.weights.gguf_blocks import BlockRows, join_block_rows, repack_kquant_rows
from engine.weights.gguf_kquants import (
    KQUANT_TYPES,
    KQuantRows,
    decode_kquant_blocks,
    join_kquant_rows,
    pack_kquant_rows,
)
from tests.engine.gguf_fixtures import tiny_tokenizer, write_tiny_gguf
from tests.engine.test_cpu_moe_experts import EXPERTS, U, _exact, _routes

needs_kernels = pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")
TYPES = list(KQUANT_TYPES)
ROWS, COLS = 40, 512  # two full tiles of 16 and a masked one; two super-blocks a row
FLOAT32_U = 2.0**-24


def _blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random blocks [rows, row bytes] whose d (and dmin) vary from block to block."""
    rng = np.random.default_rng(seed)
    block_bytes = KQUANT_TYPES[type_name][0]
    raw = rng.integers(0, 256, size=(rows, cols // 256, block_bytes), dtype=np.uint8)
    d = rng.uniform(2e-5, 2e-4, size=(rows, cols // 256, 2)).astype(np.float16)
    if type_name == "Q6_K":  # d ends the block
        raw[..., 208:210] = d[..., :1].view(np.uint8)
    else:  # d and dmin lead it
        raw[..., 0:4] = (d * [5, 2]).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def _gguf_values(data: np.ndarray, type_name: str) -> np.ndarray:
    values = quants.dequantize(data, GGMLQuantizationType[type_name])
    return values.reshape(data.shape[0], -1)


def _weight(rows: KQuantRows) -> GridWeight:
    codes, scales = pack_kquant_rows(rows)
    fmt = rows.format
    return GridWeight(codes, scales, fmt.bits, rows.rows, fmt.name, format=fmt)


def _kernel_columns(packed: GridWeight, columns: int) -> torch.Tensor:
    """The weight as the kernel multiplies it: one-hot rows quantize exactly (127 * 1/127),
    a few at a time (an AMX machine takes BF16 tiles from 64 rows on)."""
    identity = torch.eye(columns)
    return torch.cat([packed.matmul(rows, torch.float32) for rows in identity.split(8)]).T


@pytest.mark.parametrize("type_name", TYPES)
def test_blocks_decode_to_exactly_the_values_gguf_dequantizes(type_name):
    data = _blocks(type_name, ROWS, COLS, seed=1)
    rows = decode_kquant_blocks(data, type_name, COLS)
    fmt = KQUANT_TYPES[type_name][1]
    assert rows.format == fmt and rows.codes.shape == (ROWS, COLS // 32, 32)
    assert rows.codes.max() == 2**fmt.bits - 1  # every bit of the codes was read
    assert np.array_equal(rows.values(), _gguf_values(data, type_name))


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_the_kernel_multiplies_the_files_values(type_name):
    data = _blocks(type_name, ROWS, COLS, seed=2)
    packed = _weight(decode_kquant_blocks(data, type_name, COLS))
    expected = torch.from_numpy(_gguf_values(data, type_name))
    assert torch.allclose(_kernel_columns(packed, COLS), expected, rtol=0, atol=2.0**-20)
    # The BF16 expansion for matrix units: torch's cast of the very same float32 values.
    dense = grid_dequantize(packed.codes, packed.scales, packed.format, ROWS, COLS)
    assert torch.equal(dense, expected.bfloat16())
    # Rows looked up as an embedding: the same float32 values, or their BF16 casts.
    ids = torch.tensor([[ROWS - 1, 0, 17], [17, 3, ROWS - 1]])
    for dtype in (torch.float32, torch.bfloat16):
        got = grid_gather_rows(packed.codes, packed.scales, packed.format, ROWS, COLS, ids, dtype)
        assert torch.equal(got, expected.to(dtype)[ids])


@pytest.mark.parametrize(
    "type_name, bits_a_weight", [("Q4_K", 4.625), ("Q5_K", 5.625), ("Q6_K", 6.5625)]
)
def test_the_packed_weight_is_about_the_files_size(type_name, bits_a_weight):
    packed = _weight(decode_kquant_blocks(_blocks(type_name, 48, COLS, 3), type_name, COLS))
    assert packed.nbytes * 8 / (48 * COLS) == bits_a_weight
    file_bits = KQUANT_TYPES[type_name][0] * 8 / 256
    assert bits_a_weight - file_bits <= 0.125


def _bound(x: torch.Tensor, rows: KQuantRows) -> torch.Tensor:
    """The most the kernel's product may differ from the float64 one (the module doc)."""
    groups = x.double().reshape(x.shape[0], -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    per_value = (amax / 254 + 5 * amax * FLOAT32_U).expand_as(groups).reshape(x.shape)
    weight = torch.from_numpy(rows.values()).double()
    int8 = per_value @ weight.abs().T
    supers = rows.d.shape[1]
    codes = torch.from_numpy(rows.codes.astype(np.float64)).reshape(rows.rows, supers, 8, 32)
    if rows.format == GridFormat.Q6_K:
        magnitude = weight.abs()
    else:
        d, dmin = (
            torch.from_numpy(a.astype(np.float64))[..., None, None] for a in (rows.d, rows.dmin)
        )
        step = d * torch.from_numpy(rows.scales.astype(np.float64))[..., None]
        offset = dmin * torch.from_numpy(rows.mins.astype(np.float64))[..., None]
        magnitude = (step * codes).abs() + offset.abs()
    reach = (groups.abs() + amax / 127).reshape(x.shape)
    float32 = (2 * groups.shape[1] + 4) * FLOAT32_U * (reach @ magnitude.reshape(rows.rows, -1).T)
    return int8 + float32


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_products_of_1_3_6_and_16_rows_are_within_the_int8_rounding_bound(type_name):
    rows = decode_kquant_blocks(_blocks(type_name, ROWS, COLS, seed=4), type_name, COLS)
    packed = _weight(rows)
    weight = torch.from_numpy(rows.values()).double()
    x = torch.randn(16, COLS, generator=torch.Generator().manual_seed(5)) * 3
    results = {}
    for count in (1, 3, 6, 16):  # the AVX2 kernel takes rows in blocks of 4 (of 2 for Q5/Q6_K)
        got = packed.matmul(x[:count].contiguous(), torch.float32)
        error = (got.double() - x[:count].double() @ weight.T).abs()
        bound = _bound(x[:count], rows)
        assert (error <= bound).all(), float((error / bound).max())
        results[count] = got
    # One row (the accumulator in a register) sums as more rows do, bit for bit.
    assert torch.equal(results[1], results[3][:1]) and torch.equal(results[3], results[6][:3])
    assert torch.equal(results[6], results[16][:6])


@needs_kernels
def test_parts_of_one_k_quant_join_and_parts_of_two_do_not():
    """A fused layer's parts: Q4_K beside Q4_K packs; Q4_K beside Q6_K stays dense."""
    first, second = (
        decode_kquant_blocks(_blocks("Q4_K", rows, COLS, seed), "Q4_K", COLS)
        for rows, seed in ((24, 6), (16, 7))
    )
    joined = join_kquant_rows([first, second])
    assert joined.rows == 40
    expected = np.concatenate([first.values(), second.values()])
    got = _kernel_columns(_weight(joined), COLS)
    assert torch.allclose(got, torch.from_numpy(expected), rtol=0, atol=2.0**-20)
    q6 = decode_kquant_blocks(_blocks("Q6_K", 16, COLS, 8), "Q6_K", COLS)
    assert join_kquant_rows([first, q6]) is None


@needs_kernels
@pytest.mark.parametrize(
    "pieces",
    [
        [("Q4_K", slice(0, ROWS))],
        [("Q5_K", slice(3, 37))],
        [("Q6_K", slice(0, 40, 3))],
        # a fused layer: rows of one type from two tensors, picked out of order
        [("Q4_K", slice(5, 22)), ("Q4_K", np.array([39, 0, 7, 7, 12]))],
        [("Q6_K", np.array([2, 30, 31])), ("Q6_K", slice(16, 40))],
    ],
)
@pytest.mark.parametrize("sliced", [False, True])
def test_the_c_repacker_writes_what_the_numpy_packer_writes(pieces, sliced, monkeypatch):
    """gguf_kquant_repack.c reads the mapped super-blocks and writes the kernel's layout
    directly: byte for byte what decode_kquant_blocks + pack_kquant_rows give, padding
    rows included. Sliced: a long row range goes in slices of 16 rows (as a file's
    tensors go in slices of 8 MiB), each landing where the one before ended."""
    if sliced:
        monkeypatch.setattr(gguf_blocks, "_SLICE_BYTES", 1)
    files = [_blocks(t, ROWS, COLS, seed=30 + i) for i, (t, _) in enumerate(pieces)]
    block_rows = BlockRows(
        [(f, taken, t) for f, (t, taken) in zip(files, pieces, strict=True)], COLS
    )
    expected = join_kquant_rows(
        [
            decode_kquant_blocks(f[taken], t, COLS)
            for f, (t, taken) in zip(files, pieces, strict=True)
        ]
    )
    expected_codes, expected_scales = pack_kquant_rows(expected)
    codes, scales = repack_kquant_rows(block_rows)
    assert block_rows.rows == expected.rows
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)


def test_a_k_quant_beside_another_type_is_no_one_block_layout():
    q4 = (_blocks("Q4_K", 16, COLS, 40), slice(0, 16), "Q4_K")
    q6 = (_blocks("Q6_K", 16, COLS, 41), slice(0, 16), "Q6_K")
    assert join_block_rows([BlockRows([q4], COLS), BlockRows([q4], COLS)]).kind == "Q4_K"
    assert join_block_rows([BlockRows([q4], COLS), BlockRows([q6], COLS)]) is None
    with pytest.raises(ValueError, match="one K-quant type"):
        repack_kquant_rows(BlockRows([q4, q6], COLS))


def test_rows_of_partial_super_blocks_are_refused():
    data = _blocks("Q4_K", 4, COLS, 9)
    with pytest.raises(ValueError, match="whole Q4_K blocks"):
        decode_kquant_blocks(data, "Q4_K", COLS - 32)
    with pytest.raises(ValueError, match="Q8_0 is not a K-quant"):
        decode_kquant_blocks(data, "Q8_0", COLS)


@needs_kernels
def test_the_bf16_tile_path_takes_k_quants():
    rows = decode_kquant_blocks(_blocks("Q6_K", 96, 256, seed=10), "Q6_K", 256)
    packed = _weight(rows)
    weight = torch.from_numpy(rows.values())
    x = torch.randn(70, 256, generator=torch.Generator().manual_seed(11)).bfloat16()
    with use_matrix_path(BF16, min_rows=64):
        got = packed.matmul(x, torch.float32)
    exact = x.double() @ weight.double().T
    # BF16 weights and output around float32 sums: 2^-8 of sum |x||w| and of |y|.
    magnitude = x.double().abs() @ weight.double().abs().T
    assert ((got.double() - exact).abs() <= 2.0**-8 * (magnitude + exact.abs()) + 1e-6).all()


def _kquant_linear(linear, type_name: str, seed: int) -> None:
    rows, cols = linear.weight.shape
    packed = _weight(decode_kquant_blocks(_blocks(type_name, rows, cols, seed), type_name, cols))
    linear.method = GridMethod(packed, MAX_PACKED_ROWS)
    linear.weight.data = linear.weight.data.new_empty((0, cols))


@needs_kernels
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_k_quant_experts_run_in_one_call_as_the_loop_runs_them(tokens):
    """Q4_K gate_up and Q6_K down experts (a Q4_K_M MoE layer), against the loop and the
    exact sum of its products, held as tests/engine/test_cpu_moe_experts.py holds them."""
    hidden = intermediate = 256
    top_k = 4

    def expert(index: int) -> GatedMLP:
        mlp = GatedMLP(hidden, intermediate, reduce=False)
        _kquant_linear(mlp.gate_up_proj, "Q4_K", seed=100 + index)
        _kquant_linear(mlp.down_proj, "Q6_K", seed=200 + index)
        mlp.ops = CPU_LAYER_OPS
        return mlp

    routing = RoutingConfig(num_experts=EXPERTS, top_k=top_k, correction_bias=False)
    moe = SparseMoE(hidden, routing, expert).bfloat16()
    fused = CpuMoeExperts.build(moe)
    assert fused is not None
    assert (fused.gate_up_format, fused.down_format) == (GridFormat.Q4_K, GridFormat.Q6_K)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).bfloat16()
    weights, ids = _routes(tokens, top_k, gen)
    got = fused.run(x, weights, ids).double()
    loop = moe.run_experts(x, weights, ids).double()
    exact, magnitude = _exact(moe, x, weights, ids)
    assert (got - exact).abs().le(U * exact.abs() + top_k * 2.0**-23 * magnitude + 1e-30).all()
    assert (got - loop).abs().le((top_k + 2.1) * U * magnitude + 1e-30).all()


# A llama whose every linear layer's rows are whole 256-value super-blocks, typed as a
# Q4_K_M file types them (Q6_K for some attn_v and ffn_down, and the head), with a Q5_K.
_FILE_TYPES = {
    **{f"blk.{i}.{name}.weight": "Q4_K" for i in range(2) for name in ("attn_q", "attn_k")},
    **{f"blk.{i}.{name}.weight": "Q4_K" for i in range(2) for name in ("ffn_gate", "ffn_up")},
    "blk.0.attn_v.weight": "Q4_K",
    "blk.1.attn_v.weight": "Q4_K",
    "blk.0.attn_output.weight": "Q5_K",
    "blk.1.attn_output.weight": "Q4_K",
    "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.ffn_down.weight": "Q4_K",
    "output.weight": "Q6_K",
    "token_embd.weight": "Q4_K",
}
_PACKED = {
    "model.layers.0.self_attn.qkv_proj": GridFormat.Q4_K,
    "model.layers.0.self_attn.o_proj": GridFormat.Q5_K,
    "model.layers.0.mlp.gate_up_proj": GridFormat.Q4_K,
    "model.layers.0.mlp.down_proj": GridFormat.Q6_K,
    "model.layers.1.self_attn.qkv_proj": GridFormat.Q4_K,
    "model.layers.1.self_attn.o_proj": GridFormat.Q4_K,
    "model.layers.1.mlp.gate_up_proj": GridFormat.Q4_K,
    "model.layers.1.mlp.down_proj": GridFormat.Q4_K,
    "lm_head": GridFormat.Q6_K,
}
PROMPT = list(range(5, 40))


def _llama(vocab_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=50000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


@needs_kernels
@pytest.mark.parametrize("mixed_qkv", [False, True])
def test_a_k_quant_file_read_directly_computes_what_its_float32_folder_computes(
    tmp_path, mixed_qkv
):
    """Every K-quant layer packed, with no dense copy; a fused layer whose parts mix types
    (layer 1's qkv with a Q6_K attn_v beside Q4_K q and k, as Q4_K_M files have) holds a
    grid weight per part (GridParts); the last prompt tokens run as decode steps (all
    layers in one C call, the mixed layer's parts each a product of its own)."""
    tokenizer = tiny_tokenizer()
    gguf = tmp_path / "model.q4_k_m.gguf"
    types = {**_FILE_TYPES, "blk.1.attn_v.weight": "Q6_K" if mixed_qkv else "Q4_K"}
    types = {name: GGMLQuantizationType[t] for name, t in types.items()}
    write_tiny_gguf(gguf, _llama(tokenizer.get_vocab_size()), tokenizer, types)
    converted = convert_gguf(gguf, tmp_path / "converted")
    direct = tmp_path / "direct"
    shutil.copytree(converted, direct, ignore=shutil.ignore_patterns("*.safetensors"))
    (direct / GGUF_WEIGHTS).symlink_to(gguf)

    from_file = LLM(str(direct), dtype="bfloat16", kv_cache_dtype="bf16")
    model = from_file.engine.model
    packed = {
        name: getattr(grid_weight_of(module), "format", None)
        for name, module in model.named_modules()
        if grid_weight_of(module) is not None
    }
    expected = dict(_PACKED)
    if mixed_qkv:
        expected["model.layers.1.self_attn.qkv_proj"] = None  # Q4_K, Q4_K, Q6_K parts
        parts = grid_weight_of(model.model.layers[1].self_attn.qkv_proj).parts
        assert [part.format for part in parts] == [GridFormat.Q4_K] * 2 + [GridFormat.Q6_K]
    assert packed == expected
    for name, module in model.named_modules():
        if name in packed:
            assert module.weight.numel() == 0  # no dense copy was ever made
    # Mixed parts too: the C step multiplies each part into its columns.
    assert isinstance(model.model.decode_step, FusedDecode)
    if mixed_qkv:
        _batched_decode_is_the_modules(from_file)

    exact = LLM(str(converted), dtype="float32").prompt_logits(PROMPT).double()
    got = from_file.prompt_logits(PROMPT, decode_last=8).double()
    # BF16 activations, and int8 ones per group of 32 (a relative 1/254 at most), through
    # two layers: measured 0.05 and 0.10 (mixed) on logits up to 7.7 and 6.1, no more than
    # the float32 folder run dense in BF16 moves them (0.05, 0.10): int8 adds little.
    assert (got - exact).abs().max() <= 0.03 * exact.abs().max()
    assert (got.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.9


def _batched_decode_is_the_modules(llm) -> None:
    """Three sequences decoded together by the fused step (each part's rows interleaved
    into the qkv rows through scratch), then by the modules: the same tokens, and the same
    log-probabilities to the bit."""
    from engine import SamplingParams

    trunk, rows = llm.engine.model.model, []
    step = trunk.decode_step
    run = step.run

    def counted(x, *args):
        taken = run(x, *args)
        rows.append(x.shape[0] if taken else 0)
        return taken

    step.run = counted
    prompts = [list(range(5, 20)), list(range(30, 41)), list(range(7, 60, 3))]
    # Sampled with a seed each, so the sequences feed different tokens: greedy (or one
    # seed), this tiny model gives every sequence the same tokens, and rows alike would
    # hide a row mixed up.
    params = [
        SamplingParams(max_tokens=8, temperature=1.0, seed=seed, ignore_eos=True, logprobs=5)
        for seed in (1, 2, 3)
    ]
    fused = [_sampled(out) for out in llm.generate(prompts, params)]
    assert rows.count(3) == 7  # every step after the prefill's first token
    assert len({tokens for tokens, _ in fused}) == 3
    trunk.decode_step = None
    llm.engine.prefix_cache.clear()
    assert [_sampled(out) for out in llm.generate(prompts, params)] == fused


def _sampled(out) -> tuple:
    completion = out.outputs[0]
    return tuple(completion.token_ids), repr(completion.logprobs)
