"""MLA decode on FP8 tensor cores (FP8_DOT): e4m3 queries and softmax weights times e4m3 rows.

The path rounds two things the widening path keeps exact: the queries (per
head row and part, to e4m3 with the row's largest value at 448) and the
softmax weights (times P_FP8_SCALE, to e4m3). The reference below repeats
the query rounding with torch, so the only difference left is the weights'
rounding, whose bound is derived per element; under the interpreter the
e4m3 products themselves are exact (fp32 accumulation).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

pytest.importorskip("triton")

from engine.attention.triton.common import choose_fp8_dot  # noqa: E402
from engine.attention.triton.mla_decode import (  # noqa: E402
    mla_decode,
    mla_decode_splits,
    tile_config,
)
from engine.devtools.testing.fp8_decode_bound import (  # noqa: E402
    BF16_OUTPUT_ROUNDING,
    mla_reference_and_bound,
)
from engine.kv.quant import FP8_DTYPE, FP8_MAX  # noqa: E402
from tests.engine.triton.test_decode_splits import (  # noqa: E402
    MIXED_LENS,
    pad_queries,
    paged_tables,
    pool_pages,
    slots_of,
)

LORA, ROPE, HEADS, PAGE, CAPACITY = 32, 16, 4, 16, 4096
FP32_TOL = dict(rtol=1e-5, atol=1e-6)  # fp32 rounding of the scales and sums alone
BF16_OUTPUT = BF16_OUTPUT_ROUNDING


def e4m3_rows(slots: int, width: int, spread: float) -> torch.Tensor:
    """Stored rows as the pool writes them: N(0, spread) values saturated and cast to e4m3
    (so most are normal, some subnormal, a few at +-448), as uint8 bytes."""
    values = (torch.randn(slots, width) * spread).clamp(-FP8_MAX, FP8_MAX)
    return values.to(FP8_DTYPE).view(torch.uint8)


def reference_and_bound(q, rows, tables, row, latent_scale, rope_scale, softmax_scale):
    """(float64 output, per-element error bound) for one sequence of the step: the bound
    engine.devtools.testing.fp8_decode_bound derives from the weights' e4m3 rounding."""
    stored = rows[slots_of(tables, row)]
    return mla_reference_and_bound(q[row], stored, LORA, latent_scale, rope_scale, softmax_scale)


def fp8_step(dtype: torch.dtype, device):
    """A decode step over FP8 rows: mixed lengths with pad rows (NaN queries), heads of
    different sizes (the last one sharp enough that many weights fall below e4m3's normal
    range), and latent and rope parts of different sizes (each gets its own scale)."""
    tables = paged_tables(MIXED_LENS, CAPACITY, PAGE, device)
    slots = pool_pages(MIXED_LENS, PAGE) * PAGE
    rows = torch.cat([e4m3_rows(slots, LORA, 24.0), e4m3_rows(slots, ROPE, 96.0)], dim=1)
    head_size = torch.tensor([1.0, 0.5, 2.0, 6.0]).view(1, HEADS, 1)
    q = torch.randn(len(MIXED_LENS), HEADS, LORA + ROPE) * head_size
    q[..., LORA:] *= 0.05  # the rope part much smaller than the latent part
    q = pad_queries(q, MIXED_LENS).to(device, dtype)
    return q, rows.to(device), tables, LORA, 0.011, 0.0037, 0.35


# The pad rows' NaN queries meet a row maximum (numpy warns under the interpreter);
# those rows read nothing, so their queries never reach a dot.
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dot_within_the_bound_of_its_rounded_weights(seed, device, dtype):
    """Forced FP8_DOT (the interpreter runs it for both dtypes) against float64 over the same
    quantized queries: every element within its derived bound; pad rows exactly zero; the
    300-token row cut into several splits, each rounding its weights against its own maximum."""
    step = fp8_step(dtype, device)
    q, rows, tables, _, latent_scale, rope_scale, softmax_scale = step
    block_n, _ = tile_config(fp8_dot=True)
    eager = dataclasses.replace(tables, max_seq_len=max(MIXED_LENS))
    split = 2 * block_n  # whole tiles of either path (the widening one's are shorter)
    poisoned = torch.full((len(MIXED_LENS), HEADS, LORA), float("nan"), device=device)
    out = mla_decode(*step[:2], eager, *step[3:], out=poisoned.to(dtype), split_tokens=split)
    _, part_lse = mla_decode_splits(*step[:2], eager, *step[3:], split_tokens=split, fp8_dot=True)
    assert torch.isfinite(part_lse[MIXED_LENS.index(300), 0]).sum() > 1  # several splits
    forced = mla_decode(*step[:2], eager, *step[3:], split_tokens=split, fp8_dot=True)
    # fp8_dot=None takes this path wherever choose_fp8_dot (shared with GQA) says so: bf16
    # queries on an sm_89+ GPU, any queries under the interpreter; else the widening one.
    default_is_fp8 = choose_fp8_dot(q, rows, None)
    assert torch.equal(out, forced) == default_is_fp8
    widened = mla_decode(*step[:2], eager, *step[3:], split_tokens=split, fp8_dot=False)
    assert torch.equal(out, widened) != default_is_fp8
    out = forced
    assert not out.isnan().any()
    worst = 0.0
    for row, length in enumerate(MIXED_LENS):
        if length == 0:
            assert torch.equal(out[row], torch.zeros_like(out[row]))
            continue
        ref, bound = reference_and_bound(q, rows, tables, row, *step[4:])
        if dtype == torch.bfloat16:
            bound = bound + BF16_OUTPUT * ref.abs()
        error = (out[row].double().cpu() - ref.cpu()).abs()
        assert (error <= bound.cpu()).all(), (row, (error / bound.cpu()).max().item())
        worst = max(worst, (error / bound.cpu()).max().item())
    assert worst > 0.0  # the weights' rounding shows: the bound is not vacuous here


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_query_and_probability_scales_are_undone(seed, device, dtype):
    """Two tokens whose exact softmax weights are powers of two, so FP8_DOT is exact up to
    fp32 rounding, and each scale the kernel applies is needed for the right answer.

    Token A's latent and rope rows meet the query only in column 0; token B is zero there.
    Head 0's query is 3 in its latent column 0 and 0.5 in its rope column 0, so the score
    difference is 3*2*latent_scale + 0.5*1*rope_scale = 4 (in log2 units, the softmax scale
    being ln 2): weights 1 and 2^-4, both exact in e4m3 times P_FP8_SCALE (256 and 16).
    Head 1 (1 and 0.5) gives 2 and weights 1 and 2^-2. The output is their mix of the rows.
    - P scale not divided back out: the output is 256 times too large.
    - A query row scale dropped (the e4m3 row used as if it were the query): that part's
      score grows 448/3 or 448 times (latent) or 896 times (rope), so token B's weight becomes
      2^-hundreds and the output token A's row alone, off by 1/17 or 1/5 of the mix.
    - The latent and rope scales swapped or shared: the scores are no longer 4 and 2.
    """
    latent_scale, rope_scale, softmax_scale = 0.5, 2.0, math.log(2.0)
    tables = paged_tables([2], 64, PAGE, device)
    rows = torch.zeros(pool_pages([2], PAGE) * PAGE, LORA + ROPE)
    token_a, token_b = slots_of(tables, 0).cpu().tolist()
    rows[token_a, :LORA] = torch.randn(LORA).clamp(-8, 8)
    rows[token_b, :LORA] = torch.randn(LORA).clamp(-8, 8)
    rows[token_a, 0], rows[token_b, 0] = 2.0, 0.0
    rows[token_a, LORA], rows[token_b, LORA] = 1.0, 0.0
    rows = rows.to(FP8_DTYPE).view(torch.uint8).to(device)
    q = torch.zeros(1, 2, LORA + ROPE)
    q[0, 0, 0], q[0, 0, LORA] = 3.0, 0.5
    q[0, 1, 0], q[0, 1, LORA] = 1.0, 0.5
    q = q.to(device, dtype)
    out = mla_decode(
        q, rows, tables, LORA, latent_scale, rope_scale, softmax_scale, fp8_dot=True
    ).cpu()
    stored = rows.cpu().view(FP8_DTYPE).double()[:, :LORA]
    for head, score in ((0, 4), (1, 2)):
        weight_b = 2.0**-score
        mix = (stored[token_a] + weight_b * stored[token_b]) / (1 + weight_b) * latent_scale
        tol = dict(rtol=BF16_OUTPUT, atol=1e-6) if dtype == torch.bfloat16 else FP32_TOL
        torch.testing.assert_close(out[0, head].double(), mix, **tol)
        # What a dropped scale would give instead, far outside the tolerance.
        assert not torch.allclose(out[0, head].double(), stored[token_a] * latent_scale, **tol)


def test_small_weights_survive_as_e4m3(device):
    """One token scores 12 (log2 units) above 63 others, so each of theirs weighs 2^-12
    against it: below e4m3's smallest step (2^-9) on its own, so only the P_FP8_SCALE
    factor (256: 2^-4, exact) keeps it. Together they carry 63/4096 of the mass, and here
    all of the output's column 1 (token A is 0 there, the others 4), which without the
    factor would be 0. Token A comes first, so every later weight is rounded against the
    final maximum. The query's rope part is all zero (its row scale is then 1)."""
    latent_scale, rope_scale, softmax_scale = 0.5, 2.0, math.log(2.0)
    tables = paged_tables([64], 64, PAGE, device)
    slots = slots_of(tables, 0).cpu()
    rows = torch.zeros(pool_pages([64], PAGE) * PAGE, LORA + ROPE)
    rows[slots[0], 0] = 8.0  # token A: 3 * 8 * latent_scale = 12
    rows[slots[1:], 1] = 4.0
    rows[slots[1:], LORA] = 1.0  # rope values the zero rope query must not see
    rows = rows.to(FP8_DTYPE).view(torch.uint8).to(device)
    q = torch.zeros(1, 1, LORA + ROPE)
    q[0, 0, 0] = 3.0
    out = mla_decode(
        q.to(device), rows, tables, LORA, latent_scale, rope_scale, softmax_scale, fp8_dot=True
    ).cpu()
    small = 63 * 2.0**-12
    expected = torch.zeros(LORA, dtype=torch.float64)
    expected[0] = 8.0 / (1 + small) * latent_scale
    expected[1] = 4.0 * small / (1 + small) * latent_scale
    torch.testing.assert_close(out[0, 0].double(), expected, **FP32_TOL)


def test_fp8_dot_on_bf16_rows_is_a_clear_error(device):
    tables = paged_tables([3], 64, PAGE, device)
    rows = torch.randn(pool_pages([3], PAGE) * PAGE, LORA + ROPE).to(device, torch.bfloat16)
    q = torch.randn(1, HEADS, LORA + ROPE).to(device, torch.bfloat16)
    with pytest.raises(ValueError, match="fp8_dot needs FP8 pages"):
        mla_decode(q, rows, tables, LORA, 1.0, 1.0, 0.1, fp8_dot=True)
