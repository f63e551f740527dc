"""AttentionMetadata: the causal mask each query sees, built only when a backend asks."""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata


def _meta(query_lens, context_lens):
    slots = [torch.arange(100 * b, 100 * b + n) for b, n in enumerate(context_lens)]
    new = torch.cat([s[n - q :] for s, q, n in zip(slots, query_lens, context_lens, strict=True)])
    return AttentionMetadata.build(query_lens, context_lens, new, slots, torch.device("cpu"))


def test_the_mask_is_built_on_first_use_and_is_each_querys_causal_limit():
    query_lens, context_lens = [3, 1, 2], [5, 4, 2]
    meta = _meta(query_lens, context_lens)
    assert meta.mask_cache is None  # nothing built until a backend asks
    mask = meta.mask
    assert mask is meta.mask and mask.shape == (3, 1, 3, 5)
    for b, (q_len, ctx) in enumerate(zip(query_lens, context_lens, strict=True)):
        for q in range(3):
            # A real query at position ctx - q_len + q; a pad row sees position 0 only.
            last = ctx - q_len + q if q < q_len else 0
            expected = [position <= last for position in range(5)]
            assert mask[b, 0, q].tolist() == expected, (b, q)


def test_no_mask_where_every_query_may_see_everything_before_it():
    assert _meta([6], [6]).mask is None  # one fresh prompt: plain causal
    assert _meta([1], [9]).mask is None  # one decode row
    assert _meta([2], [9]).mask is not None  # a chunk over a cached prefix
