"""DESIGN.md §3: with FP8 KV a prompt computes the same function however it is prefilled.

Attention always reads K and V back from the cache, so one chunk, several
chunks and token-by-token decoding see the same quantized values; only the
floating-point summation order may differ.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM
from engine.kv.quant import FP8_DTYPE

# Same quantized inputs, different reduction order (float32 activations).
INVARIANCE_TOL = 1e-4
PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 88, 130, 12, 33, 301, 4, 76, 200, 9, 14, 15, 92, 6]


@pytest.fixture(scope="module")
def fp8_llm(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="fp8_e4m3")
    llm.prompt_logits(PROMPT)  # calibrates and freezes the scales
    return llm


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_prefill_matches_single_chunk(fp8_llm, chunk):
    whole = fp8_llm.prompt_logits(PROMPT)
    chunked = fp8_llm.prompt_logits(PROMPT, chunk_size=chunk)
    assert (whole - chunked).abs().max().item() < INVARIANCE_TOL


def test_fp8_cache_is_really_quantized(fp8_llm, tiny_llama_dir):
    """FP8 logits differ from float32-KV logits: the cache path is exercised, not bypassed."""
    pool = fp8_llm.engine.pool
    assert pool.storage.dtype == torch.uint8 and pool.is_fp8
    stored = pool.storage[0, :4].view(FP8_DTYPE).float()
    assert torch.isfinite(stored).all()
    exact = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto").prompt_logits(PROMPT)
    assert (exact - fp8_llm.prompt_logits(PROMPT)).abs().max().item() > INVARIANCE_TOL


def test_scales_are_frozen_after_first_prefill(fp8_llm):
    before = fp8_llm.engine.pool.scales()
    fp8_llm.prompt_logits([300, 301, 302, 303] * 4)
    assert fp8_llm.engine.pool.scales() == before
