"""GLM-5.x and DeepSeek V3.2 from FP8 block-scaled checkpoints, as their FP8 releases store them.

The releases (DeepSeek-V3.2, GLM-5-FP8: `quantization_config` quant_method fp8,
weight_block_size [128, 128]) quantize every projection of attention and MoE
and, in the lightning indexer, `wq_b` and `wk`; the indexer's `weights_proj`
stays BF16 and `k_norm` unquantized (tests/engine/dsa_checkpoints.py writes
them so). The engine keeps the FP8 layers packed and the indexer's head
weights dense float32; against transformers on the same weights dequantized,
float32 logits agree within the tolerance the FP8 DeepSeek V3 checkpoint test
uses (1e-4; measured about 5e-6), chunked or token by token, and greedy tokens
agree, with the 40-token prompt sparse past index_topk = 8. 16x16 blocks give
every projection several blocks and partial edges; 128x128 is the release's.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.devtools.testing.layouts import read_config
from engine.layers.linear_methods import MethodLinear
from engine.layers.packed_methods import Fp8BlockMethod
from tests.engine.checkpoints import assert_greedy_matches_reference, reference_logits
from tests.engine.dsa_checkpoints import as_released_fp8, build_deepseek_v32, build_glm_moe_dsa

FP32_ATOL = 1e-4
PROMPT = torch.randint(2, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
BUILDERS = {"glm_moe_dsa": build_glm_moe_dsa, "deepseek_v32": build_deepseek_v32}
CASES = [("glm_moe_dsa", (16, 16)), ("glm_moe_dsa", (128, 128)), ("deepseek_v32", (16, 16))]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-block{c[1][0]}")
def fp8(request, tmp_path_factory):
    family, block = request.param
    folder = tmp_path_factory.mktemp(f"{family}-fp8-{block[0]}") / "model"
    quantized, reference = as_released_fp8(BUILDERS[family], folder, block)
    llm = LLM(str(quantized), dtype="float32", kv_cache_dtype="auto", kv_memory=0.01)
    return quantized, reference, llm


def test_the_indexer_loads_in_its_released_form(fp8):
    quantized, _, llm = fp8
    assert read_config(quantized)["quantization_config"]["quant_method"] == "fp8"
    indexer = llm.engine.model.model.layers[0].self_attn.indexer
    for projection in (indexer.wq_b, indexer.wk):
        assert isinstance(projection.method, Fp8BlockMethod)  # kept packed
        assert projection.weight.dtype == torch.float8_e4m3fn
    assert not isinstance(indexer.weights_proj.method, Fp8BlockMethod)
    packed = [
        m
        for m in llm.engine.model.modules()
        if isinstance(getattr(m, "method", None), Fp8BlockMethod)
    ]
    assert all(isinstance(m, MethodLinear) for m in packed) and len(packed) >= 40


def test_bf16_serving_keeps_the_indexer_head_weights_float32(fp8):
    """The checkpoint's BF16 weights_proj is served in float32, as transformers keeps it,
    beside FP8 wq_b and wk, whatever the serving dtype."""
    quantized, _, _ = fp8
    llm = LLM(str(quantized), dtype="bfloat16", kv_cache_dtype="fp8_e4m3", kv_memory=0.01)
    indexer = llm.engine.model.model.layers[0].self_attn.indexer
    assert indexer.weights_proj.weight.dtype == torch.float32
    assert indexer.wq_b.weight.dtype == indexer.wk.weight.dtype == torch.float8_e4m3fn
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    assert len(llm.generate([PROMPT], params)[0].outputs[0].token_ids) == 4


def test_logits_match_transformers_on_the_dequantized_weights(fp8):
    _, reference, llm = fp8
    expected = reference_logits(reference, PROMPT)
    for chunk in (None, 1):  # one masked prefill; sparse decode steps over the C kernel
        diff = (llm.prompt_logits(PROMPT, chunk_size=chunk) - expected).abs().max().item()
        assert diff < FP32_ATOL, f"chunk {chunk}: max |diff| {diff}"


def test_greedy_tokens_match_transformers(fp8):
    _, reference, llm = fp8
    prompt = PROMPT[:12]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    tokens = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert assert_greedy_matches_reference(reference, prompt, tokens, FP32_ATOL) > 0
