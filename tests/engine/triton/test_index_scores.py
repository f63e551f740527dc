"""The indexer's decode scores from paged keys (Triton) against sparse_mla.index_scores over
the gathered keys, and the top-k the Triton backend hands sparse MLA decode."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.metadata import AttentionMetadata  # noqa: E402
from engine.attention.sparse_mla import (  # noqa: E402
    index_scores,
    paged_decode_selection,
    select_top_k,
)
from engine.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from engine.attention.triton.common import step_tables  # noqa: E402
from engine.attention.triton.index_scores import paged_index_scores  # noqa: E402
from engine.kv.dsa_layout import DSALayout  # noqa: E402
from engine.kv.pools import make_pool  # noqa: E402
from tests.engine.triton.cases import page_tables, pages_needed  # noqa: E402

# float32 products either way; only the summation order differs.
TOL = dict(atol=1e-5, rtol=1e-5)


def decode_step(context_lens: list[int], page: int, device) -> tuple[AttentionMetadata, int]:
    """A decode step's metadata over sequences on random pages, and the pool's page count."""
    num_pages = pages_needed(context_lens, page)
    slots = page_tables(context_lens, page, num_pages)
    last = torch.stack([s[-1] for s in slots])
    meta = AttentionMetadata.build([1] * len(slots), context_lens, last, slots, device)
    return meta, num_pages


def visible(meta: AttentionMetadata, device) -> torch.Tensor:
    lengths = torch.tensor(meta.context_lens, device=device)
    return torch.arange(max(meta.context_lens), device=device)[None, :] < lengths[:, None]


@pytest.mark.parametrize(
    "heads, dim, page, context_lens, key_dtype",
    [
        (8, 16, 4, [5, 37, 20], torch.float32),  # one head tile, sequences of every shape
        (20, 24, 16, [70, 1], torch.float32),  # heads and width below their tiles: masked
        (8, 32, 4, [33, 17], torch.bfloat16),  # keys as an FP8 or BF16 cache stores them
    ],
)
def test_paged_scores_match_index_scores(seed, device, heads, dim, page, context_lens, key_dtype):
    meta, num_pages = decode_step(context_lens, page, device)
    keys = torch.randn(num_pages * page, dim).to(device, key_dtype)
    queries = torch.randn(len(context_lens), heads, dim, device=device)
    weights = torch.randn(len(context_lens), heads, device=device)
    scale = dim**-0.5
    got = paged_index_scores(queries, weights, keys, step_tables(meta, page), scale)
    ref = index_scores(queries[:, None], weights[:, None], keys[meta.context_slots], scale)[:, 0]
    seen = visible(meta, device)
    torch.testing.assert_close(got[seen], ref[seen], **TOL)
    assert torch.isneginf(got[~seen]).all()  # so the top-k takes them last


def test_backend_selection_keeps_the_torch_top_k(seed, device):
    """The Triton backend's selection from paged scores against select_top_k over the
    gathered keys: the same slots (the scores are far apart at the k-th: distinct floats)."""
    layout = DSALayout(
        num_layers=2, kind="mla", latent_dim=24, rope_dim=8, index_dim=16, index_layers=(1,)
    )
    lens, page, heads, topk = [40, 6, 23], 4, 8, 8
    meta, num_pages = decode_step(lens, page, device)
    pool = make_pool(layout, num_pages, page, "bf16", device)
    everywhere = torch.arange(num_pages * page, device=device)
    pool.write_index_keys(1, torch.randn(len(everywhere), 16, device=device), everywhere)
    queries = torch.randn(len(lens), 1, heads, 16, device=device)
    weights = torch.randn(len(lens), 1, heads, device=device)
    backend = TritonAttentionBackend()
    got = paged_decode_selection(1, queries, weights, pool, meta, topk, 0.25, backend).meta
    keys = pool.gather_index_keys(1, meta.context_slots)
    ref = select_top_k(queries, weights, keys, meta, topk, 0.25).meta
    assert got.context_lens == ref.context_lens == [8, 6, 8]  # min(length, top-k)
    assert got.context_is_selection and ref.context_is_selection
    for b, n in enumerate(got.context_lens):
        assert torch.equal(got.context_slots[b, :n], ref.context_slots[b, :n])
    # A sequence within top-k keeps its whole context, in order.
    assert torch.equal(got.context_slots[1, :6], meta.context_slots[1, :6])
