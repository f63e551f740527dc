"""MLA decode over FP8/BF16 latent rows (absorbed query) against the torch absorbed path."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.mla import MLADims, mla_attention  # noqa: E402
from engine.attention.triton.backend import TritonAttentionBackend  # noqa: E402
from engine.attention.triton.common import step_tables  # noqa: E402
from engine.attention.triton.mla_decode import mla_decode  # noqa: E402
from tests.engine.triton.cases import LAYER, mla_case, written_rows  # noqa: E402

# The same stored rows; W_UK/W_UV products and summation order differ slightly.
TOL = dict(atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "heads, lora_rank, rope_dim, page, context_lens, kv_dtype",
    [
        (4, 32, 16, 4, [3, 17, 41], "fp8_e4m3"),  # heads padded to one tile of 16
        (20, 32, 16, 16, [16, 33], "fp8_e4m3"),  # two head tiles, the second partial
        (4, 48, 8, 4, [1, 22], "bf16"),  # dims below their tiles: masked columns
    ],
)
def test_mla_decode_matches_torch_absorbed(
    seed, device, heads, lora_rank, rope_dim, page, context_lens, kv_dtype
):
    dims = MLADims(num_heads=heads, nope_dim=16, rope_dim=rope_dim, v_dim=16, lora_rank=lora_rank)
    case = mla_case(dims, page, context_lens, kv_dtype, device)
    args = (case.q_nope, case.q_rope, case.latent, case.k_rope, case.kv_b_weight)
    scale = 0.13
    ref = mla_attention(LAYER, *args, case.pools[0], case.meta, dims, scale, path="absorbed")
    backend = TritonAttentionBackend()
    # The widening path, exact up to summation order like the torch reference
    # (test_mla_decode_fp8.py bounds the e4m3 tensor-core path, the default for FP8 rows).
    backend.fp8_dot = False
    out = mla_attention(LAYER, *args, case.pools[1], case.meta, dims, scale, backend=backend)
    assert backend.mla_decode_calls == 1  # the hook ran the kernel, not the torch path
    torch.testing.assert_close(out, ref, **TOL)
    slots = case.meta.slot_mapping
    assert torch.equal(
        written_rows(case.pools[1], LAYER, slots), written_rows(case.pools[0], LAYER, slots)
    )


def test_split_mla_decode_matches_reference(seed, device):
    """Forced splits (some past a sequence's end) against softmax over dequantized rows
    (the widening path; test_mla_decode_fp8.py checks the e4m3 one)."""
    dims = MLADims(num_heads=4, nope_dim=16, rope_dim=16, v_dim=16, lora_rank=32)
    lens, page, r = [70, 2, 33], 4, 32
    case = mla_case(dims, page, lens, "fp8_e4m3", device)
    pool, meta = case.pools[1], case.meta
    pool.write(LAYER, case.latent, case.k_rope, meta.slot_mapping)
    latent_scale, rope_scale = 0.037, 0.21  # any positive scales, not only powers of two
    q = torch.randn(3, 4, r + 16, device=device)
    poisoned = torch.full((3, 4, r), float("nan"), device=device)
    rows = pool.storage[LAYER]
    tables = step_tables(meta, page)
    out = mla_decode(
        q,
        rows,
        tables,
        r,
        latent_scale,
        rope_scale,
        0.2,
        out=poisoned,
        split_tokens=16,
        fp8_dot=False,
    )
    assert not out.isnan().any()
    for b, length in enumerate(lens):
        stored = rows[meta.context_slots[b, :length]].view(torch.float8_e4m3fn).double()
        latent, rope = stored[:, :r] * latent_scale, stored[:, r:] * rope_scale
        scores = (q[b, :, :r].double() @ latent.T + q[b, :, r:].double() @ rope.T) * 0.2
        ref = (torch.softmax(scores, dim=-1) @ latent).float()
        torch.testing.assert_close(out[b], ref, **TOL)


def test_non_decode_steps_stay_on_torch(seed, device):
    """A prefill step returns None from the kernel hook, so mla_attention runs torch."""
    dims = MLADims(num_heads=4, nope_dim=16, rope_dim=16, v_dim=16, lora_rank=32)
    case = mla_case(dims, 4, [5, 9], "bf16", device)
    backend = TritonAttentionBackend()
    meta = case.meta
    meta.decode_only = False
    args = (case.q_nope, case.q_rope, case.latent, case.k_rope, case.kv_b_weight)
    assert backend.mla_decode(LAYER, *args, case.pools[1], meta, dims, 0.1) is None
    assert backend.mla_decode_calls == 0
