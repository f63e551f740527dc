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


def _general(query_lens, context_lens):
    """What build lays out for any step, written out: the reference for its decode form."""
    batch, max_q, max_l = len(query_lens), max(query_lens), max(context_lens)
    query_index = torch.zeros(batch, max_q, dtype=torch.long)
    query_pos = torch.zeros(batch, max_q, dtype=torch.long)
    slots = torch.zeros(batch, max_l, dtype=torch.long)
    output_index, start = [], 0
    for b, (q, n) in enumerate(zip(query_lens, context_lens, strict=True)):
        query_index[b, :q] = torch.arange(start, start + q)
        query_pos[b, :q] = torch.arange(n - q, n)
        slots[b, :n] = torch.arange(100 * b, 100 * b + n)
        output_index += range(b * max_q, b * max_q + q)
        start += q
    return query_index, query_pos, slots, torch.tensor(output_index)


def test_a_decode_step_lays_out_what_any_step_does():
    for context_lens in ([7], [1], [5, 9, 1], [3, 3]):
        query_lens = [1] * len(context_lens)
        meta = _meta(query_lens, context_lens)
        query_index, query_pos, slots, output_index = _general(query_lens, context_lens)
        assert meta.decode_only and meta.query_lens == query_lens
        assert torch.equal(meta.query_index, query_index)
        assert torch.equal(meta.query_positions, query_pos)
        assert torch.equal(meta.context_slots, slots)
        assert torch.equal(meta.output_index, output_index)
        assert meta.is_causal_single == (context_lens == [1])
        assert (meta.key_padding is None) == (len(context_lens) == 1)
        if meta.key_padding is not None:
            lengths = torch.tensor(context_lens)[:, None]
            want = torch.arange(max(context_lens))[None, :] >= lengths
            assert torch.equal(meta.key_padding.view(len(context_lens), -1), want)
