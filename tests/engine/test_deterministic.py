"""--deterministic: outputs bit-identical alone, in a batch, chunked, cold or cached."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import EngineError

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 301, 4, 76, 200, 9, 14, 15, 92] * 4


@pytest.fixture(scope="module")
def fp8_llama_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with every projection FP8 block-scaled (DeepSeek's layout)."""
    from engine.devtools.testing.quantized import as_fp8_block

    folder = tmp_path_factory.mktemp("fp8-llama")
    path, _ = as_fp8_block(tiny_llama_dir, folder / "model", folder / "reference", block=(16, 16))
    return path


# KV cache dtype, and whether the weights are the FP8 block-scaled checkpoint's (kept
# packed: `fp8-block-tiled` layers) rather than the dense BF16 ones.
@pytest.fixture(
    scope="module",
    params=[("bf16", False), ("fp8_e4m3", False), ("bf16", True)],
    ids=["bf16", "fp8_e4m3", "fp8-block-weights"],
)
def llm(request, tiny_llama_dir):
    kv, packed = request.param
    model = request.getfixturevalue("fp8_llama_dir") if packed else tiny_llama_dir
    return LLM(
        str(model),
        dtype="bfloat16",
        kv_cache_dtype=kv,
        deterministic=True,
        enable_prefix_caching=False,
    )


def test_logits_identical_however_chunked(llm):
    llm.prompt_logits(PROMPT)  # calibrate FP8 scales first
    whole = llm.prompt_logits(PROMPT)
    for chunk in (1, 7, 16, 33):
        assert torch.equal(llm.prompt_logits(PROMPT, chunk_size=chunk), whole), chunk


def test_greedy_identical_alone_and_in_a_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    alone = llm.generate([PROMPT], params)[0].outputs[0]
    others = [[(7 * i + j) % 300 + 3 for j in range(5 + 3 * i)] for i in range(31)]
    batch = llm.generate([PROMPT] + others, params)[0].outputs[0]
    assert batch.token_ids == alone.token_ids
    assert [lp.logprob for lp in batch.logprobs] == [lp.logprob for lp in alone.logprobs]


def test_identical_cold_and_cached(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype="fp8_e4m3", deterministic=True)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0)
    llm.generate([[9, 9, 9]], params)  # calibrates scales, so both runs below see the same ones
    cold = llm.generate([PROMPT + [1, 2]], params)[0]
    warm = llm.generate([PROMPT + [1, 2]], params)[0]
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens > 0
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert [lp.logprob for lp in warm.outputs[0].logprobs] == [
        lp.logprob for lp in cold.outputs[0].logprobs
    ]


def test_deterministic_close_to_default_path(tiny_llama_dir):
    """Same function, different reduction order: float32 logits agree closely."""
    fast = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto").prompt_logits(PROMPT)
    det = LLM(
        str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto", deterministic=True
    ).prompt_logits(PROMPT)
    assert (fast - det).abs().max().item() < 1e-4


def test_refused_where_not_implemented(tiny_llama_dir, monkeypatch):
    from engine.models.llama import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "supports_deterministic", False)
    with pytest.raises(EngineError, match="deterministic"):
        LLM(str(tiny_llama_dir), deterministic=True)


def test_packed_fp8_weights_stay_packed(fp8_llama_dir):
    """The batch invariance of these layers is checked with the others (the `llm` fixture)."""
    llm = LLM(str(fp8_llama_dir), dtype="bfloat16", deterministic=True)
    methods = llm.stats()["linear_methods"]
    assert methods.get("fp8-block-tiled", 0) > 0 and "fp8-block" not in methods


def test_packed_fp8_deterministic_close_to_the_packed_default_path(fp8_llama_dir):
    kwargs = dict(dtype="float32", kv_cache_dtype="auto")
    fast = LLM(str(fp8_llama_dir), **kwargs).prompt_logits(PROMPT)
    det = LLM(str(fp8_llama_dir), deterministic=True, **kwargs).prompt_logits(PROMPT)
    assert (fast - det).abs().max().item() < 1e-4
