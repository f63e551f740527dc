"""The C prefill attention kernel (engine/cpu_kernels/paged_prefill.c) against the torch backend."""

from __future__ import annotations

import pytest
import torch

from engine.attention.cpu_backend import CPUAttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.cpu_kernels import library
from engine.cpu_kernels.paged_prefill import paged_prefill, prefill_supports
from engine.kv.pool import PagedKVPool
from engine.kv.sizing import KVLayout
from tests.engine.conftest import count_calls

pytestmark = pytest.mark.skipif(
    not library.bf16_dot_products(),
    reason=f"CPU kernels: {library.unavailable() or 'the CPU lacks avx512_bf16'}",
)
# BF16 queries, BF16-rounded probabilities and a BF16 output: both sides round
# to 8 significant bits, so results agree to a few BF16 steps of the largest value.
BF16_TOL = 1e-2


def _step(kv_dtype, per_head, kv_heads, dim, prefixes, news, gen):
    """A pool holding each sequence's cached prefix, and the metadata and new K/V of a
    step that adds `news[b]` tokens to sequence b (1 = a decode row in a mixed step)."""
    layout = KVLayout(num_layers=2, kind="gqa", num_kv_heads=kv_heads, head_dim=dim)
    pool = PagedKVPool(layout, 64, 16, kv_dtype, per_head_scales=per_head)
    order = torch.randperm(64 * 16, generator=gen)
    contexts, new_slots = [], []
    for b, (prefix, new) in enumerate(zip(prefixes, news, strict=True)):
        slots = order[b * 300 : b * 300 + prefix + new]
        contexts.append(slots)
        new_slots.append(slots[prefix:])
        for layer in range(2):
            if prefix:
                k = torch.randn(prefix, kv_heads, dim, generator=gen) * 2
                pool.write(
                    layer, k, torch.randn(prefix, kv_heads, dim, generator=gen), slots[:prefix]
                )
    lens = [p + n for p, n in zip(prefixes, news, strict=True)]
    meta = AttentionMetadata.build(news, lens, torch.cat(new_slots), contexts, torch.device("cpu"))
    tokens = sum(news)
    k = (torch.randn(tokens, kv_heads, dim, generator=gen) * 2).bfloat16()
    v = torch.randn(tokens, kv_heads, dim, generator=gen).bfloat16()
    return pool, meta, k, v


@pytest.mark.parametrize(
    "kv_dtype, per_head", [("bf16", False), ("fp8_e4m3", False), ("fp8_e4m3", True)]
)
@pytest.mark.parametrize(
    "q_heads, kv_heads, dim", [(9, 3, 64), (4, 4, 32), (8, 1, 128), (16, 2, 96)]
)
@pytest.mark.parametrize(
    "prefixes, news",
    [
        ([0], [45]),  # one fresh prompt: plain causal
        ([70], [33]),  # a chunk over a cached prefix
        ([0, 40, 99, 5], [19, 1, 50, 1]),  # prefills and decode rows in one step
    ],
)
def test_prefill_matches_the_torch_backend(
    kv_dtype, per_head, q_heads, kv_heads, dim, prefixes, news
):
    gen = torch.Generator().manual_seed(q_heads * dim + sum(news))
    pool, meta, k, v = _step(kv_dtype, per_head, kv_heads, dim, prefixes, news, gen)
    q = torch.randn(sum(news), q_heads, dim, generator=gen).bfloat16()
    assert prefill_supports(q, pool.storage[0])
    for layer in range(2):
        want = TorchAttentionBackend().forward(layer, q, k, v, pool, meta, dim**-0.5)
        got = CPUAttentionBackend().forward(layer, q, k, v, pool, meta, dim**-0.5)
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        error = (got.float() - want.float()).abs().max()
        assert error <= BF16_TOL * want.float().abs().max()


def test_the_kernel_never_builds_the_mask():
    gen = torch.Generator().manual_seed(5)
    pool, meta, k, v = _step("fp8_e4m3", False, 2, 64, [30, 0], [20, 12], gen)
    q = torch.randn(32, 4, 64, generator=gen).bfloat16()
    CPUAttentionBackend().forward(0, q, k, v, pool, meta, 0.125)
    assert meta.mask_cache is None  # the causal limit is the kernel's own


def test_prefill_leaves_float32_queries_and_storage_to_torch():
    storage = torch.zeros(32, 2, 2, 64, dtype=torch.bfloat16)
    assert not prefill_supports(torch.zeros(3, 4, 64), storage)  # float32 queries: exact path
    assert not prefill_supports(torch.zeros(3, 4, 64).bfloat16(), storage.float())
    assert not prefill_supports(torch.zeros(3, 4, 40).bfloat16(), storage[..., :40])
    assert prefill_supports(torch.zeros(3, 4, 64).bfloat16(), storage)


def test_the_causal_limit_is_each_querys_own_position():
    """A key written after a query's position must not change that query's output."""
    gen = torch.Generator().manual_seed(3)
    storage = torch.randn(40, 2, 1, 32, generator=gen).bfloat16()
    q = torch.randn(40, 2, 32, generator=gen).bfloat16()
    slots = torch.arange(40).view(1, 40)
    ones = torch.ones(1)

    def run():
        return paged_prefill(q, storage, slots, torch.tensor([40]), [40], ones, ones, 0.2)

    before = run()
    storage[39] = 100.0  # only the last query may see it
    after = run()
    assert torch.equal(before[:39], after[:39])
    assert not torch.equal(before[39], after[39])


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_a_bf16_model_prefills_the_same_on_the_cpu_backend(tiny_llama_dir, kv, monkeypatch):
    from engine import LLM
    from engine.attention import cpu_backend

    calls = count_calls(monkeypatch, cpu_backend, "paged_prefill")
    prompt = [(7 * i + 3) % 300 + 2 for i in range(90)]

    def logits(backend, chunk):
        llm = LLM(
            str(tiny_llama_dir), dtype="bfloat16", kv_cache_dtype=kv, attention_backend=backend
        )
        return llm.prompt_logits(prompt, chunk_size=chunk).float()

    want = logits("torch", None)
    for chunk in (None, 32):  # whole, and chunks over a cached prefix
        got = logits("cpu", chunk)
        # BF16 activations through two layers: 0.5-0.8% of the largest logit measured
        assert (got - want).abs().max() <= 0.02 * want.abs().max()
    assert len(calls) >= 2 * (1 + 3)  # two layers; one whole prefill, three chunks
