"""BF16 on CPU at TP 2: the C layer ops run on every rank and the modules keep their
all-reduces, so greedy tokens equal TP 1's. (Grid packing and the fused decode step
stay single-rank; this model's random weights are dense at TP 1 too.)"""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.cpu_kernels import layer_ops as kernels
from engine.cpu_kernels.library import unavailable
from engine.layers.layer_ops import CPU_LAYER_OPS
from engine.testing.checkpoints import tiny_llama
from tests.engine.conftest import count_calls

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=f"CPU kernels: {unavailable()}")

SETTINGS = dict(dtype="bfloat16", kv_cache_dtype="bf16", kv_memory=0.01, kv_rotation="hadamard")
_rng = random.Random(15)
PROMPTS = [[_rng.randrange(3, 320) for _ in range(n)] for n in (41, 7, 23)]
GREEDY = SamplingParams(max_tokens=16, temperature=0, logprobs=1, ignore_eos=True)
# BF16 partial sums over the ranks round differently from TP 1's whole products.
BF16_LOGPROB_ATOL = 0.1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # A wider init than transformers' 0.02: confident predictions that vary from token
    # to token, not near-ties that BF16 rounding would decide.
    return tiny_llama(
        tmp_path_factory.mktemp("bf16") / "llama",
        initializer_range=0.1,
        hidden_size=128,
        intermediate_size=256,
    )


def test_tp2_bf16_with_c_layer_ops_matches_tp1(model_dir, monkeypatch):
    with LLM(str(model_dir), **SETTINGS) as llm:
        tp1 = llm.generate(PROMPTS, GREEDY)
    calls = count_calls(monkeypatch, kernels, "silu_mul")
    with LLM(str(model_dir), tensor_parallel_size=2, **SETTINGS) as llm:
        model = llm.engine.model  # rank 0's; the workers build theirs the same way
        layer = model.model.layers[0]
        assert layer.mlp.ops is CPU_LAYER_OPS and layer.self_attn.kv_rotation.ops is CPU_LAYER_OPS
        assert model.model.decode_step is None  # the fused step runs no collectives
        tp2 = llm.generate(PROMPTS, GREEDY)
    assert calls  # rank 0's MLPs went through the kernel
    for one, two in zip(tp1, tp2, strict=True):
        assert two.outputs[0].token_ids == one.outputs[0].token_ids
        for a, b in zip(one.outputs[0].logprobs, two.outputs[0].logprobs, strict=True):
            assert abs(a.logprob - b.logprob) < BF16_LOGPROB_ATOL
    assert len({t for o in tp1 for t in o.outputs[0].token_ids}) > 10  # not one repeated token
