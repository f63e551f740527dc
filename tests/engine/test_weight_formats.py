"""FP8 block-quantized and compressed-tensors INT4 weights: the math, the loader, whole models.

Model tolerances (float32): the engine dequantizes exactly what the
reference folder holds, so logits stay within 1e-4 of transformers' on the
dequantized weights, and greedy tokens are equal.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from engine import LLM, SamplingParams
from engine.errors import CheckpointError, UnsupportedModelError
from engine.model_files.model_config import parse_config
from engine.models.loader import iter_tensors
from engine.weights.formats import weight_decoder
from engine.weights.fp8_block_format import dequantize_fp8_block, quantize_fp8_block
from engine.weights.int4_packed import (
    PackedInt4Decoder,
    PackedInt4Scheme,
    dequantize_packed_int4,
    pack_int4,
    unpack_int4,
)
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.moe_checkpoints import (
    as_fp8_block,
    as_int4_experts,
    build_deepseek_v3,
    copy_checkpoint,
    fp8_block_reference,
    int4_quantization_config,
    pack_int4_reference,
    read_config,
    read_tensors,
)

FP32_ATOL = 1e-4
# From 2: reference_greedy treats token 0 as padding and masks it out.
PROMPT = torch.randint(2, 256, (30,), generator=torch.Generator().manual_seed(3)).tolist()


def make_llm(path) -> LLM:
    return LLM(str(path), dtype="float32", kv_cache_dtype="auto", kv_memory=0.01)


# ----- FP8 block --------------------------------------------------------------------


def test_fp8_block_round_trip_with_partial_edge_blocks():
    torch.manual_seed(0)
    weight = (
        torch.randn(200, 300) * 0.05
    ).bfloat16()  # 2x3 blocks, the last row and column partial
    quantized, scale_inv, restored = fp8_block_reference(weight, (128, 128))
    assert quantized.dtype == torch.float8_e4m3fn and scale_inv.shape == (2, 3)
    got = dequantize_fp8_block(quantized, scale_inv, (128, 128), torch.float32)
    assert torch.equal(got, restored)  # exactly the straightforward dequantization
    # ... and the original within FP8 error: 3 mantissa bits, plus subnormal spacing.
    block_scale = scale_inv.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300]
    bound = weight.float().abs() * 2**-4 + block_scale * 2**-9
    assert bool(((got - weight.float()).abs() <= bound).all())
    # The engine's own quantizer (for writing checkpoints) agrees with the reference.
    ours, our_scales = quantize_fp8_block(weight, (128, 128))
    assert torch.equal(our_scales, scale_inv)
    assert torch.equal(ours.view(torch.uint8), quantized.view(torch.uint8))
    bf16 = dequantize_fp8_block(quantized, scale_inv, (128, 128), torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, restored.bfloat16())


def test_fp8_block_tensors_stored_and_decoded_by_the_loader(tmp_path):
    torch.manual_seed(1)
    weight = (torch.randn(200, 300) * 0.05).bfloat16()
    quantized, scale_inv, restored = fp8_block_reference(weight, (128, 128))
    file = tmp_path / "model.safetensors"
    save_file(
        {
            "model.layers.0.mlp.down_proj.weight": quantized,
            "model.layers.0.mlp.down_proj.weight_scale_inv": scale_inv,
            "model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
        },
        str(file),
    )
    raw = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    decoder = weight_decoder(parse_config(raw), torch.bfloat16)
    decoded = dict(decoder.stream(iter_tensors([file])))
    assert sorted(decoded) == ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    got = decoded["model.layers.0.mlp.down_proj.weight"]
    assert got.dtype == torch.bfloat16 and torch.equal(got, restored.bfloat16())


def test_fp8_scale_of_the_wrong_shape_is_named():
    quantized, scale_inv = quantize_fp8_block(torch.randn(200, 300))
    with pytest.raises(CheckpointError, match=r"layers\.0\.o_proj\.weight_scale_inv has shape"):
        dequantize_fp8_block(quantized, scale_inv[:1], name="layers.0.o_proj.weight")


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return build_deepseek_v3(tmp_path_factory.mktemp("ds") / "bf16")


@pytest.mark.parametrize("block", [(128, 128), (16, 16)])
def test_fp8_block_checkpoint_matches_reference(block, deepseek, tmp_path):
    # With 16x16 blocks every projection has several blocks and partial edges
    # (kv_a_proj_with_mqa is 24x64, kv_b_proj 128x16, q_b_proj 96x32).
    quantized, reference = as_fp8_block(deepseek, tmp_path / "fp8", tmp_path / "ref", block)
    assert any(t.dtype == torch.float8_e4m3fn for t in read_tensors(quantized).values())
    llm = make_llm(quantized)
    expected = reference_logits(reference, PROMPT)
    for chunk in (None, 1):
        diff = (llm.prompt_logits(PROMPT, chunk_size=chunk) - expected).abs().max().item()
        assert diff < FP32_ATOL, f"chunk {chunk}: max |diff| {diff}"
    if block == (16, 16):
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        tokens = llm.generate([PROMPT[:10]], params)[0].outputs[0].token_ids
        assert assert_greedy_matches_reference(reference, PROMPT[:10], tokens, FP32_ATOL)


def test_fp8_weight_without_its_scale_is_named(deepseek, tmp_path):
    quantized, _ = as_fp8_block(deepseek, tmp_path / "fp8", tmp_path / "ref", (16, 16))
    tensors = read_tensors(quantized)
    del tensors["model.layers.1.self_attn.kv_b_proj.weight_scale_inv"]
    broken = copy_checkpoint(quantized, tmp_path / "broken", tensors)
    with pytest.raises(
        CheckpointError, match=r"layers\.1\.self_attn\.kv_b_proj\.weight_scale_inv is missing"
    ):
        make_llm(broken)


# ----- INT4 pack-quantized -----------------------------------------------------------


@pytest.mark.parametrize("shape", [(5, 64), (3, 44), (7, 8)])
def test_int4_packing_matches_the_straightforward_layout(shape):
    torch.manual_seed(0)
    values = torch.randint(-8, 8, shape, dtype=torch.int8)
    packed = pack_int4(values)
    assert packed.dtype == torch.int32
    assert torch.equal(packed, pack_int4_reference(values))
    assert torch.equal(unpack_int4(packed, shape[1]), values)


def straightforward_int4_dequant(packed, scale, shape, group):
    rows, cols = shape
    out = torch.empty(rows, cols)
    for r in range(rows):
        for c in range(cols):
            word = int(packed[r, c // 8]) & 0xFFFFFFFF
            nibble = (word >> (4 * (c % 8))) & 0xF
            out[r, c] = (nibble - 8) * float(scale[r, c // group])
    return out


@pytest.mark.parametrize("shape, group", [((6, 64), 32), ((4, 44), 32), ((3, 40), 16)])
def test_int4_dequantization_matches_a_reference(shape, group):
    torch.manual_seed(0)
    values = torch.randint(-8, 8, shape, dtype=torch.int8)
    packed = pack_int4_reference(values)
    scale = (torch.rand(shape[0], -(-shape[1] // group)) + 0.1).bfloat16()
    got = dequantize_packed_int4(packed, scale, shape, group, torch.float32)
    assert torch.equal(got, straightforward_int4_dequant(packed, scale, shape, group))


def test_int4_tensor_of_the_wrong_shape_is_named():
    packed = pack_int4(torch.zeros(6, 64, dtype=torch.int8))
    scale = torch.ones(6, 2)
    with pytest.raises(
        CheckpointError, match=r"experts\.3\.up_proj\.weight_packed has shape \(6, 8\)"
    ):
        dequantize_packed_int4(packed, scale, (6, 72), 32, name="experts.3.up_proj.weight")
    with pytest.raises(
        CheckpointError, match=r"weight_scale has shape \(6, 2\), expected \(6, 4\)"
    ):
        dequantize_packed_int4(packed, scale, (6, 64), 16)


def test_int4_ignore_list_is_honoured():
    scheme = PackedInt4Scheme.from_quantization_config(int4_quantization_config(32))
    assert scheme.ignores("lm_head")
    assert scheme.ignores("model.layers.3.self_attn.q_a_proj")
    assert scheme.ignores("model.layers.3.mlp.shared_experts.down_proj")
    assert scheme.ignores("model.layers.0.mlp.gate_proj")  # the dense MLP
    assert not scheme.ignores("model.layers.3.mlp.experts.17.down_proj")
    decoder = PackedInt4Decoder(scheme, torch.float32)
    plain = torch.randn(4, 64)
    parts = {
        "model.layers.0.self_attn.o_proj.weight_packed": pack_int4(
            torch.zeros(4, 64, dtype=torch.int8)
        ),
        "model.layers.0.self_attn.o_proj.weight_scale": torch.ones(4, 2),
        "model.layers.0.self_attn.o_proj.weight_shape": torch.tensor([4, 64]),
    }
    # An ignored module stored plain passes through untouched ...
    assert list(decoder.stream([("lm_head.weight", plain)])) == [("lm_head.weight", plain)]
    # ... and one stored packed contradicts the config.
    with pytest.raises(CheckpointError, match=r"ignore says model\.layers\.0\.self_attn\.o_proj"):
        list(decoder.stream(parts.items()))


def test_int4_expert_checkpoint_matches_reference(deepseek, tmp_path):
    quantized, reference = as_int4_experts(deepseek, tmp_path / "int4", tmp_path / "ref")
    names = read_tensors(quantized)
    assert "model.layers.1.mlp.experts.0.down_proj.weight_packed" in names
    assert "model.layers.1.mlp.shared_experts.down_proj.weight" in names  # ignored: stays plain
    llm = make_llm(quantized)
    expected = reference_logits(reference, PROMPT)
    diff = (llm.prompt_logits(PROMPT) - expected).abs().max().item()
    assert diff < FP32_ATOL
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    tokens = llm.generate([PROMPT[:10]], params)[0].outputs[0].token_ids
    assert assert_greedy_matches_reference(reference, PROMPT[:10], tokens, FP32_ATOL)


def test_int4_checkpoint_with_a_misshapen_expert_is_named(deepseek, tmp_path):
    quantized, _ = as_int4_experts(deepseek, tmp_path / "int4", tmp_path / "ref")
    tensors = read_tensors(quantized)
    name = "model.layers.1.mlp.experts.2.gate_proj.weight_packed"
    tensors[name] = tensors[name][:, :4].contiguous()
    broken = copy_checkpoint(quantized, tmp_path / "broken", tensors)
    with pytest.raises(CheckpointError, match=r"experts\.2\.gate_proj\.weight_packed has shape"):
        make_llm(broken)


# ----- format detection --------------------------------------------------------------


@pytest.mark.parametrize(
    "qc, message",
    [
        ({"quant_method": "awq", "bits": 4}, r"quant_method 'awq' is not supported"),
        ({"quant_method": "fp8", "fmt": "e4m3"}, r"per-tensor FP8"),
        (
            {**int4_quantization_config(), "format": "float-quantized"},
            r"format 'float-quantized' is not supported",
        ),
    ],
)
def test_unsupported_quantization_is_refused_by_name(deepseek, qc, message):
    raw = read_config(deepseek)
    raw["quantization_config"] = qc
    with pytest.raises(UnsupportedModelError, match=message):
        weight_decoder(parse_config(raw), torch.bfloat16)
