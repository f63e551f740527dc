"""Sparse MLA decode on the Triton backend: the absorbed kernel reading each sequence's
selected slots (a DSA selection, step_tables' one-token pages) against the torch sparse
path on the same selection, with every unselected row of the context poisoned."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.mla import MLADims  # noqa: E402
from engine.attention.sparse_decode import selected_context  # noqa: E402
from engine.attention.sparse_mla import Selection, sparse_mla_attention  # noqa: E402
from engine.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from engine.attention.triton.common import step_tables  # noqa: E402
from engine.attention.triton.mla_decode import mla_decode  # noqa: E402
from engine.devtools.testing.fp8_decode_bound import (  # noqa: E402
    excess_over_bound,
    mla_reference_and_bound,
)
from tests.engine.triton.cases import LAYER, mla_case  # noqa: E402

TOL = dict(atol=5e-5, rtol=1e-4)  # as test_mla_decode.py: summation order only
TOPK = 6
POISON = {"fp8_e4m3": 0x7F, "bf16": float("nan")}  # 0x7F is an e4m3 NaN


def chosen_positions(context_lens: list[int]) -> torch.Tensor:
    """[B, TOPK] positions as torch.topk returns them: unsorted, a random subset of a long
    sequence (skipping positions), and for a short one all of its positions then some past
    its end (scored -inf, so taken last)."""
    width = max(context_lens)
    rows = []
    for length in context_lens:
        if length >= TOPK:
            rows.append(torch.randperm(length)[:TOPK])
        else:
            past = length + torch.randperm(width - length)[: TOPK - length]
            rows.append(torch.cat([torch.randperm(length), past]))
    return torch.stack(rows)


def poison_unselected(case, compact) -> None:
    """NaN in both pools at every context row the selection skips (slot 0 aside: padded
    positions point at it, and the torch reference multiplies their zero weights by it)."""
    kept = set()
    for b, n in enumerate(compact.context_lens):
        kept.update(compact.context_slots[b, :n].tolist())
    for b, length in enumerate(case.meta.context_lens):
        for slot in case.meta.context_slots[b, :length].tolist():
            if slot not in kept and slot != 0:
                for pool in case.pools:
                    pool.storage[LAYER][slot] = POISON[pool.kv_dtype]


def sparse_case(kv_dtype: str, device, context_lens=(3, 17, 41), heads=4):
    dims = MLADims(num_heads=heads, nope_dim=16, rope_dim=16, v_dim=16, lora_rank=32)
    case = mla_case(dims, 4, list(context_lens), kv_dtype, device)
    compact = selected_context(case.meta, chosen_positions(list(context_lens)).to(device))
    poison_unselected(case, compact)
    return dims, case, compact


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "bf16"])
def test_sparse_decode_on_triton_matches_the_torch_sparse_path(seed, device, kv_dtype):
    dims, case, compact = sparse_case(kv_dtype, device)
    assert compact.context_lens == [3, TOPK, TOPK]
    args = (case.q_nope, case.q_rope, case.latent, case.k_rope, case.kv_b_weight)
    scale, selections = 0.13, [Selection(meta=compact)]
    ref = sparse_mla_attention(LAYER, *args, case.pools[0], case.meta, dims, scale, selections)
    backend = TritonAttentionBackend()
    backend.fp8_dot = False  # widened FP8 rows: the torch arithmetic, in another order
    out = sparse_mla_attention(
        LAYER, *args, case.pools[1], case.meta, dims, scale, selections, backend=backend
    )
    assert backend.mla_decode_calls == 1  # the kernel ran, over the selection
    assert not out.isnan().any()  # no unselected (poisoned) row was read
    torch.testing.assert_close(out, ref, **TOL)


def test_dense_groups_keep_the_page_tables(seed, device):
    """A group within top-k (no selection) attends over its whole context through the
    page tables, as plain MLA decode does."""
    dims = MLADims(num_heads=4, nope_dim=16, rope_dim=16, v_dim=16, lora_rank=32)
    case = mla_case(dims, 4, [3, 5], "bf16", device)
    args = (case.q_nope, case.q_rope, case.latent, case.k_rope, case.kv_b_weight)
    ref = sparse_mla_attention(LAYER, *args, case.pools[0], case.meta, dims, 0.2, [None])
    backend = TritonAttentionBackend()
    out = sparse_mla_attention(
        LAYER, *args, case.pools[1], case.meta, dims, 0.2, [None], backend=backend
    )
    assert backend.mla_decode_calls == 1 and step_tables(case.meta, 4).page_size == 4
    torch.testing.assert_close(out, ref, **TOL)


def test_fp8_tensor_core_path_over_a_selection_is_within_its_bound(seed, device):
    """The e4m3-dot loop (the GPU default over FP8 rows) reads a selection too: each
    sequence's output within the FP8 bound of softmax over its selected rows only."""
    dims, case, compact = sparse_case("fp8_e4m3", device, context_lens=(9, 40), heads=20)
    pool = case.pools[1]
    pool.write(LAYER, case.latent, case.k_rope, compact.slot_mapping)
    r = dims.lora_rank
    q = torch.randn(2, dims.num_heads, r + dims.rope_dim, device=device)
    latent_scale, rope_scale = float(pool.latent_scale[LAYER]), float(pool.rope_scale[LAYER])
    rows = pool.storage[LAYER]
    tables = step_tables(compact, pool.page_size)
    assert tables.page_size == 1 and tables.max_seq_len == TOPK
    out = mla_decode(q, rows, tables, r, latent_scale, rope_scale, 0.2, fp8_dot=True)
    for b, n in enumerate(compact.context_lens):
        stored = rows[compact.context_slots[b, :n]]
        ref, bound = mla_reference_and_bound(q[b], stored, r, latent_scale, rope_scale, 0.2)
        assert excess_over_bound(out[b], ref, bound) <= 0
