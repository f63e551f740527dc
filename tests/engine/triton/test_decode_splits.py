"""Decode kernels on a grid fixed for CUDA graphs: splits planned from the capacity, pad rows.

A captured decode step plans its split count from the pool's capacity
(`tables.max_seq_len`), not from the longest sequence in the step, and pads
its batch bucket with rows of seq_len 0. Here the GQA and MLA split kernels
run such steps over hand-built page tables (as wide as the capacity, pad
rows pointing at page 0) and must match a float64 softmax over the stored
values, match the eager plan, cut each sequence by its own length, and give
pad rows zeros rather than NaN.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402

from engine.attention.triton.common import (  # noqa: E402
    StepTables,
    plan_splits,
    sequence_split_tokens,
)
from engine.attention.triton.decode import (  # noqa: E402
    BLOCK_N,
    FP8_BLOCK_N,
    gqa_decode,
    gqa_decode_splits,
    merge_splits,
    split_plan,
)
from engine.attention.triton.mla_decode import (  # noqa: E402
    mla_decode,
    mla_decode_splits,
    tile_config,
)
from engine.attention.triton.mla_decode import split_plan as mla_split_plan  # noqa: E402
from engine.kv.pool_base import STORAGE_DTYPES  # noqa: E402
from tests.engine.triton.cases import reference_attention  # noqa: E402

# Both sides read the same stored values; only summation order differs.
FP32_TOL = dict(atol=2e-5, rtol=1e-4)
BF16_TOL = dict(atol=1e-2, rtol=1e-2)  # bf16 activations: the output is rounded to bf16
MIXED_LENS = [0, 1, 37, 300, 0]  # a pad row first and last (how a bucket is padded)
CAPACITY = 4096
PAGE = 16


def paged_tables(lens: list[int], capacity: int, page: int, device) -> StepTables:
    """One decode step over pages drawn at random, each row's table as wide as the capacity.

    Pad rows (length 0) point every entry at page 0, as the graph runner's
    padding does; whatever page 0 holds, their output must be zeros.
    """
    width = triton.cdiv(capacity, page)
    free = (torch.randperm(pool_pages(lens, page) - 1) + 1).tolist()
    tables = torch.zeros(len(lens), width, dtype=torch.int32)
    for row, length in enumerate(lens):
        for i in range(triton.cdiv(length, page)):
            tables[row, i] = free.pop()
    lengths = torch.tensor(lens, dtype=torch.int32, device=device)
    ones = torch.ones_like(lengths)
    return StepTables(
        page_size=page,
        block_tables=tables.to(device),
        seq_lens=lengths,
        query_lens=ones,
        query_starts=torch.cumsum(ones, 0, dtype=torch.int32) - 1,
        max_seq_len=capacity,
        max_query_len=1,
    )


def pool_pages(lens: list[int], page: int) -> int:
    """Pages of a pool that holds the rows of `lens` (page 0 only for pad rows) and one spare."""
    return sum(triton.cdiv(n, page) for n in lens) + 2


def slots_of(tables: StepTables, row: int) -> torch.Tensor:
    """The cache slots of one row's positions 0..len-1."""
    length = int(tables.seq_lens[row])
    positions = torch.arange(length, device=tables.block_tables.device)
    pages = tables.block_tables[row, positions // tables.page_size].long()
    return pages * tables.page_size + positions % tables.page_size


def random_storage(shape, kv_dtype: str, device) -> torch.Tensor:
    """Stored K/V or latent values: any e4m3 byte but NaN codes, or bf16 normals."""
    if kv_dtype == "fp8_e4m3":
        raw = torch.randint(0, 256, shape, dtype=torch.int32).to(torch.uint8)
        raw[(raw & 0x7F) == 0x7F] = 0
        return raw.to(device)
    return torch.randn(shape).to(device, STORAGE_DTYPES[kv_dtype])


def as_values(stored: torch.Tensor) -> torch.Tensor:
    """Stored values as float64, before their dequant scale."""
    if stored.dtype == torch.uint8:
        stored = stored.view(torch.float8_e4m3fn)
    return stored.double()


def pad_queries(q: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """NaN queries in the pad rows: a graph's static input buffer may hold anything there."""
    q[torch.tensor(lens) == 0] = float("nan")
    return q


def filled_splits(part_lse: torch.Tensor) -> list[int]:
    """How many splits saw a token, per row (every head of a row agrees)."""
    seen = torch.isfinite(part_lse).sum(-1)  # [B, H]
    assert (seen == seen[:, :1]).all()
    return seen[:, 0].tolist()


def expected_splits(lens: list[int], splits: int, block_n: int) -> list[int]:
    return [triton.cdiv(n, sequence_split_tokens(n, splits, block_n)) for n in lens]


@pytest.fixture
def small_gpu(monkeypatch):
    """Plan splits as for the interpreter's 4 SMs on any device: the grid for the capacity
    then has 2 splits of 2,048 tokens, so one plan-wide split would hold every test row."""
    from engine.attention.triton import decode, mla_decode
    from engine.attention.triton.target import INTERPRETER_SMS

    for module in (decode, mla_decode):
        monkeypatch.setattr(module, "sm_count", lambda device: INTERPRETER_SMS)


# --- the host plan -------------------------------------------------------------------------


@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("num_sms", [4, 132])
def test_eager_steps_keep_the_layout_plan_splits_chose(block_n, num_sms):
    """Planned from the longest sequence, the kernels cut it into the same number of splits
    plan_splits counted, none longer than its size: no eager step gets slower."""
    for programs in (1, 3, 8, 64, 512):
        for max_len in [*range(1, 2000, 7), 4096, 32768, 100_096, 131_072]:
            splits, per_split = plan_splits(programs, max_len, block_n, num_sms)
            per = sequence_split_tokens(max_len, splits, block_n)
            assert per <= per_split and per % block_n == 0
            assert triton.cdiv(max_len, per) == splits, (programs, max_len)


def test_a_capacity_grid_spreads_short_sequences_over_several_programs():
    """One sequence on an H200-sized GPU (8 KV heads, 132 SMs) in a grid planned for 128k."""
    splits, per_capacity = plan_splits(8, 131_072, BLOCK_N, 132)
    assert splits > 30  # about two programs per SM
    for length, old_splits, new_splits in ((8192, 3, 32), (4096, 2, 16), (1000, 1, 4)):
        # Splits of the plan's size (what the kernels used before) would leave most idle.
        assert triton.cdiv(length, per_capacity) == old_splits
        per = sequence_split_tokens(length, splits, BLOCK_N)
        assert triton.cdiv(length, per) == new_splits == plan_splits(8, length, BLOCK_N, 132)[0]
    assert sequence_split_tokens(0, splits, BLOCK_N) == BLOCK_N  # a pad row: no work at all
    assert sequence_split_tokens(5000, splits, BLOCK_N, fixed_split=64) == 64


def test_a_split_size_must_be_positive():
    with pytest.raises(ValueError, match="split_tokens must be a positive number"):
        plan_splits(8, 1000, BLOCK_N, 132, split_tokens=0)


# --- the merge -----------------------------------------------------------------------------


def test_merge_gives_zeros_for_a_row_that_saw_nothing(device):
    """The old merge took max(lse) = -inf for such a row and divided 0 by 0 (NaN)."""
    part_out = torch.zeros(2, 3, 4, 8, device=device)
    part_lse = torch.full((2, 3, 4), float("-inf"), device=device)
    part_out[1, :, 1] = torch.randn(3, 8, device=device)
    part_lse[1, :, 1] = 2.5  # row 1 saw tokens in split 1 only
    out = torch.full((2, 3, 8), float("nan"), device=device)
    merge_splits(part_out, part_lse, out)
    assert torch.equal(out[0], torch.zeros(3, 8, device=device))
    torch.testing.assert_close(out[1], part_out[1, :, 1])


# --- GQA -----------------------------------------------------------------------------------


def gqa_step(lens, kv_dtype, dtype, device, kv_heads=1, group=4, head_dim=16):
    tables = paged_tables(lens, CAPACITY, PAGE, device)
    slots = pool_pages(lens, PAGE) * PAGE
    storage = random_storage((slots, 2, kv_heads, head_dim), kv_dtype, device)
    if kv_dtype == "fp8_e4m3":
        k_scales = torch.rand(kv_heads, device=device) * 0.1 + 1e-3
        v_scales = torch.rand(kv_heads, device=device) * 0.1 + 1e-3
    else:
        k_scales = v_scales = torch.ones(kv_heads, device=device)
    q = pad_queries(torch.randn(len(lens), kv_heads * group, head_dim), lens).to(device, dtype)
    return q, storage, tables, k_scales, v_scales, head_dim**-0.5


def gqa_reference(q, storage, tables, k_scales, v_scales, scale, row) -> torch.Tensor:
    stored = as_values(storage[slots_of(tables, row)])
    keys = (stored[:, 0] * k_scales.view(1, -1, 1).double()).float()
    values = (stored[:, 1] * v_scales.view(1, -1, 1).double()).float()
    return reference_attention(q[row : row + 1].float(), keys, values, scale)[0]


@pytest.mark.parametrize(
    "kv_dtype, dtype, tol",
    [
        ("fp8_e4m3", torch.float32, FP32_TOL),
        ("fp8_e4m3", torch.bfloat16, BF16_TOL),
        ("bf16", torch.float32, FP32_TOL),
        ("bf16", torch.bfloat16, BF16_TOL),
    ],
)
def test_gqa_grid_planned_for_the_capacity_matches_reference(seed, device, kv_dtype, dtype, tol):
    step = gqa_step(MIXED_LENS, kv_dtype, dtype, device)
    q, tables = step[0], step[2]
    eager = dataclasses.replace(tables, max_seq_len=max(MIXED_LENS))
    poisoned = torch.full_like(q, float("nan"))
    # The widening path, exact up to summation order (test_decode_fp8_dot.py: e4m3 dots).
    out = gqa_decode(*step, out=poisoned, fp8_dot=False)
    eager_out = gqa_decode(*step[:2], eager, *step[3:], fp8_dot=False)
    assert not out.isnan().any() and not eager_out.isnan().any()
    for row, length in enumerate(MIXED_LENS):
        if length == 0:
            assert torch.equal(out[row], torch.zeros_like(out[row]))
            continue
        ref = gqa_reference(*step, row)
        torch.testing.assert_close(out[row].float(), ref, **tol)
        torch.testing.assert_close(out[row], eager_out[row], **tol)


@pytest.mark.parametrize("fp8_dot, block_n", [(False, BLOCK_N), (True, FP8_BLOCK_N)])
def test_gqa_each_sequence_fills_its_own_splits(seed, device, small_gpu, fp8_dot, block_n):
    """The grid is planned for the capacity; each row uses as many splits as its length
    wants, in the widening kernel and in the e4m3 one (decode_fp8.py, its own tile)."""
    step = gqa_step(MIXED_LENS, "fp8_e4m3", torch.float32, device)
    splits, per_capacity = split_plan(len(MIXED_LENS), 1, CAPACITY, device, fp8_dot=fp8_dot)
    part_out, part_lse = gqa_decode_splits(*step, fp8_dot=fp8_dot)
    assert part_lse.shape[-1] == splits > 1
    assert per_capacity > max(MIXED_LENS)  # a plan-wide split size would use one program
    filled = filled_splits(part_lse)
    assert filled == expected_splits(MIXED_LENS, splits, block_n)
    assert filled[MIXED_LENS.index(300)] > 1 and filled[0] == 0
    empty = torch.isinf(part_lse)
    assert (part_out[empty] == 0).all()  # nothing seen: a zero partial, never garbage


def test_gqa_fixed_split_tokens_still_override_every_sequence(seed, device):
    q, storage, tables, *scales = gqa_step(MIXED_LENS, "bf16", torch.float32, device)
    eager = dataclasses.replace(tables, max_seq_len=max(MIXED_LENS))  # few splits: fast
    _, part_lse = gqa_decode_splits(q, storage, eager, *scales, split_tokens=BLOCK_N)
    assert filled_splits(part_lse) == [triton.cdiv(n, BLOCK_N) for n in MIXED_LENS]


# --- MLA -----------------------------------------------------------------------------------

LORA, ROPE, MLA_HEADS = 32, 16, 4


def mla_step(lens, kv_dtype, device):
    tables = paged_tables(lens, CAPACITY, PAGE, device)
    slots = pool_pages(lens, PAGE) * PAGE
    rows = random_storage((slots, LORA + ROPE), kv_dtype, device)
    scales = (0.037, 0.21) if kv_dtype == "fp8_e4m3" else (1.0, 1.0)
    q = pad_queries(torch.randn(len(lens), MLA_HEADS, LORA + ROPE), lens).to(device)
    return q, rows, tables, LORA, *scales, 0.2


def mla_reference(q, rows, tables, lora, latent_scale, rope_scale, scale, row) -> torch.Tensor:
    stored = as_values(rows[slots_of(tables, row)])
    latent, rope = stored[:, :lora] * latent_scale, stored[:, lora:] * rope_scale
    scores = (q[row, :, :lora].double() @ latent.T + q[row, :, lora:].double() @ rope.T) * scale
    return (torch.softmax(scores, dim=-1) @ latent).float()


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "bf16"])
def test_mla_grid_planned_for_the_capacity_matches_reference(seed, device, kv_dtype):
    step = mla_step(MIXED_LENS, kv_dtype, device)
    tables = step[2]
    eager = dataclasses.replace(tables, max_seq_len=max(MIXED_LENS))
    poisoned = torch.full((len(MIXED_LENS), MLA_HEADS, LORA), float("nan"), device=device)
    # The widening path, exact up to summation order (test_mla_decode_fp8.py: e4m3 dots).
    out = mla_decode(*step, out=poisoned, fp8_dot=False)
    eager_out = mla_decode(*step[:2], eager, *step[3:], fp8_dot=False)
    assert not out.isnan().any() and not eager_out.isnan().any()
    for row, length in enumerate(MIXED_LENS):
        if length == 0:
            assert torch.equal(out[row], torch.zeros_like(out[row]))
            continue
        ref = mla_reference(*step, row)
        torch.testing.assert_close(out[row], ref, **FP32_TOL)
        torch.testing.assert_close(out[row], eager_out[row], **FP32_TOL)


def test_mla_each_sequence_fills_its_own_splits(seed, device, small_gpu):
    step = mla_step(MIXED_LENS, "fp8_e4m3", device)
    block_n, _ = tile_config()
    splits, per_capacity = mla_split_plan(len(MIXED_LENS), MLA_HEADS, CAPACITY, device)
    _, part_lse = mla_decode_splits(*step)
    assert part_lse.shape[-1] == splits > 1 and per_capacity > max(MIXED_LENS)
    filled = filled_splits(part_lse)
    assert filled == expected_splits(MIXED_LENS, splits, block_n)
    assert filled[MIXED_LENS.index(300)] > 1 and filled[0] == 0
    eager = dataclasses.replace(step[2], max_seq_len=max(MIXED_LENS))  # few splits: fast
    _, fixed_lse = mla_decode_splits(*step[:2], eager, *step[3:], split_tokens=block_n)
    assert filled_splits(fixed_lse) == [triton.cdiv(n, block_n) for n in MIXED_LENS]


# --- CUDA graphs (a GPU only) ----------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kernel", ["gqa", "mla"])
def test_decode_replays_in_a_cuda_graph_with_new_lengths(seed, kernel):
    """Captured once with the grid planned for the capacity, replayed after the step's
    tables and queries change in place: the same result as an eager launch, no sync."""
    device = torch.device("cuda")
    if kernel == "gqa":
        step, decode = list(gqa_step(MIXED_LENS, "fp8_e4m3", torch.bfloat16, device)), gqa_decode
        out = torch.empty_like(step[0])
    else:
        step, decode = list(mla_step(MIXED_LENS, "fp8_e4m3", device)), mla_decode
        out = torch.empty(len(MIXED_LENS), MLA_HEADS, LORA, device=device)
    q, tables = step[0], step[2]
    decode(*step, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in the launch raises
    try:
        decode(*step, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(*step, out=out)
    # The next step: the same lengths in another order (a pad row now real), other pages.
    lens = [300, 37, 1, 0, 0]
    fresh = paged_tables(lens, CAPACITY, PAGE, device)
    tables.block_tables.copy_(fresh.block_tables)
    tables.seq_lens.copy_(fresh.seq_lens)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    eager = decode(*step)
    assert torch.equal(out, eager)
    for row, length in enumerate(lens):
        if length == 0:
            assert torch.equal(out[row], torch.zeros_like(out[row]))
