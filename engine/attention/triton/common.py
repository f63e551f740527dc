"""What the Triton kernels share: dtype choices, the FP8 read, per-step page tables, split sizes.

Kernels read the pool's storage directly: GQA `[slots, 2, kv_heads, head_dim]`
and MLA `[slots, latent_dim]`, FP8 as uint8 bytes of float8_e4m3fn (DESIGN.md
§3), with `slot = page * page_size + offset` as the runner lays them out. So a
sequence's context is described by a page table (one int32 per page) instead
of one slot per token, and a kernel finds position p at
`table[p // page_size] * page_size + p % page_size`.

Split-K decode: the host plans the number of splits S (the grid's last
dimension) once per step from `StepTables.max_seq_len` (`plan_splits`);
each program then sizes its sequence's splits from that sequence's own
length (`split_range`). The CUDA-graph runner captures one grid per batch
bucket with max_seq_len set to the pool's capacity, so S is fixed for the
graph while every sequence still spreads its own context over up to S
programs; eager steps plan S from the longest sequence and get the layout
`plan_splits` chose for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting
from engine.attention.triton.target import capability
from engine.kv.quant import FP8_MAX

LOG2E = 1.4426950408889634  # kernels use exp2, so scores are scaled by log2(e)
FP8_MAX_VALUE = tl.constexpr(FP8_MAX)
# Splits are at least this many tokens: below it the merge costs more than the
# parallelism gains.
MIN_SPLIT_TOKENS = 256
# Programs to aim for per streaming multiprocessor when choosing a split count.
PROGRAMS_PER_SM = 2


@triton.jit
def load_as(ptrs, mask, IS_FP8: tl.constexpr, DOT: tl.constexpr):
    """Load stored K/V/latent values and convert them to the dot dtype, exactly.

    FP8 bytes are reinterpreted as e4m3 and widened in registers: every e4m3
    value is exact in bf16 and fp32, so no rounding happens before the
    scale, which callers apply to the (fp32) scores and outputs instead.
    """
    raw = tl.load(ptrs, mask=mask, other=0)
    if IS_FP8:
        x = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        x = raw.to(tl.float32)
    return x.to(DOT)


# e4m3's smallest subnormal step is 2^-9: adding and subtracting 1.5 * 2^14 (whose
# fp32 ulp is 2^-9) rounds to it, to nearest even, in plain fp32 arithmetic.
_SUBNORMAL_ROUNDER = tl.constexpr(1.5 * 2.0**14)
_E4M3_MIN_NORMAL = tl.constexpr(2.0**-6)


@triton.jit
def round_to_e4m3(x):
    """fp32 x saturated to +-448 and rounded to the nearest e4m3 value (ties to even), in fp32.

    The same value torch's `clamp(-448, 448).to(float8_e4m3fn)` gives, computed
    with integer and fp32 arithmetic so that Triton's interpreter, whose e4m3
    cast rounds wrongly (DESIGN.md §3) but converts exact values exactly,
    agrees with the GPU. Callers cast the result with `.to(tl.float8e4nv)`.
    Normal values keep 3 of fp32's 23 mantissa bits (round to nearest even on
    the 20 dropped bits); below 2^-6 the step is the fixed 2^-9.
    """
    x = tl.minimum(tl.maximum(x, -FP8_MAX_VALUE), FP8_MAX_VALUE)
    bits = x.to(tl.int32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & -0x100000).to(tl.float32, bitcast=True)
    magnitude = tl.abs(x)
    # Rounded as a magnitude and signed after, so -0 and tiny negatives keep their sign.
    subnormal = ((magnitude + _SUBNORMAL_ROUNDER) - _SUBNORMAL_ROUNDER) * tl.where(
        bits < 0, -1.0, 1.0
    )
    return tl.where(magnitude < _E4M3_MIN_NORMAL, subnormal, normal)


@triton.jit
def quantize_rows_e4m3(x, ROW_MAX: tl.constexpr):
    """fp32 tile [R, C] -> (e4m3 tile, fp32 [R] scales) with x ~= e4m3 * scale[:, None].

    Each row is scaled so its largest magnitude maps to ROW_MAX (448 uses all
    of e4m3's range); an all-zero row gets scale 1. For FP8 tensor-core dots
    whose other operand is already e4m3 (decode queries against FP8 pages).
    """
    amax = tl.max(tl.abs(x), 1)
    # IEEE divisions (a GPU's `/` is approximate), so the bytes are torch's.
    scale = tl.where(amax > 0, tl.math.div_rn(amax, ROW_MAX), 1.0)
    q = round_to_e4m3(tl.math.div_rn(x, scale[:, None]))
    return q.to(tl.float8e4nv), scale


# Softmax weights p in (0, 1] are multiplied by this before they become e4m3, so
# weights down to 2^-17 stay representable (e4m3 alone flushes below 2^-9); the
# PV accumulator is divided by it at the end. A power of two: exact both ways.
P_FP8_SCALE = 256.0
P_FP8_SCALE_VALUE = tl.constexpr(P_FP8_SCALE)


@triton.jit
def probabilities_e4m3(p):
    """Softmax weights (fp32, in [0, 1]) as the e4m3 operand of an FP8 PV dot, times
    P_FP8_SCALE: each within 2^-4 of its value relative (the half step of a 3-bit
    mantissa). The row sums stay those of the fp32 weights."""
    return round_to_e4m3(p * P_FP8_SCALE_VALUE).to(tl.float8e4nv)


def fp8_dot_supported(device: torch.device) -> bool:
    """Whether tl.dot can multiply e4m3 operands on tensor cores here: compute
    capability 8.9 or newer (Ada, Hopper, Blackwell), or the interpreter, which
    multiplies them exactly in software (CPU tests)."""
    if interpreting():
        return True
    found = capability(device)  # a CUDA device's, or the compile check's planned GPU's
    return found is not None and found >= (8, 9)


def choose_fp8_dot(q: torch.Tensor, storage: torch.Tensor, fp8_dot: bool | None) -> bool:
    """Whether a decode kernel multiplies e4m3 on tensor cores (queries and softmax
    weights quantized) or widens the stored bytes to the activations' dtype.

    None is the default: FP8 pages, bf16/fp16 activations (fp32 ones asked for full
    precision) and a GPU with FP8 tensor cores; under the interpreter any activation
    dtype, so the CPU tests run the path the GPU does. True forces it, which only
    FP8 pages allow; False keeps the widening path.
    """
    is_fp8 = storage.dtype == torch.uint8
    if fp8_dot is None:
        wanted = interpreting() or q.dtype in (torch.bfloat16, torch.float16)
        return is_fp8 and wanted and fp8_dot_supported(q.device)
    if fp8_dot and not is_fp8:
        raise ValueError(f"fp8_dot needs FP8 pages (uint8 storage), not {storage.dtype}")
    if fp8_dot and not fp8_dot_supported(q.device):
        raise ValueError("fp8_dot needs a GPU with FP8 tensor cores (compute capability 8.9+)")
    return bool(fp8_dot)


@triton.jit
def paged_tile(
    table, n0, end, stride_slot, d, d_mask, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Offsets of positions [n0, n0 + BLOCK_N) x columns d in one head's paged storage
    (`table` is the sequence's page table), with the positions below `end` and the
    tile's mask: (offsets [BLOCK_N, len(d)], n_mask [BLOCK_N], tile_mask)."""
    pos = n0 + tl.arange(0, BLOCK_N)
    n_mask = pos < end
    page = tl.load(table + pos // PAGE_SIZE, mask=n_mask, other=0)
    slot = page.to(tl.int64) * PAGE_SIZE + pos % PAGE_SIZE
    offsets = slot[:, None] * stride_slot + d[None, :]
    return offsets, n_mask, n_mask[:, None] & d_mask[None, :]


def dot_config(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """The dtype tl.dot multiplies in and its input precision, for activations of `dtype`.

    On a GPU bf16/fp16 activations multiply in their own type on tensor cores
    (e4m3 values are exact in both) with fp32 accumulation, and fp32 ones in
    full IEEE precision (Triton's default would be tf32). The interpreter's
    tl.dot gives garbage for bf16 operands (seen with Triton 3.9: results of
    order 1e10), so under it everything multiplies in fp32.
    """
    if interpreting() or dtype == torch.float32:
        return tl.float32, "ieee"
    if dtype == torch.float16:
        return tl.float16, "tf32"
    return tl.bfloat16, "tf32"  # "tf32" is the default and only matters for fp32 operands


def block_size(n: int, minimum: int = 16) -> int:
    """The power-of-two tile covering n (tl.dot needs at least 16 along every dimension)."""
    return max(minimum, triton.next_power_of_2(n))


@dataclass
class StepTables:
    """Per-step tensors every layer's kernels share, built once per step."""

    page_size: int
    block_tables: torch.Tensor  # [B, pages] int32: page of each page-sized run of positions
    seq_lens: torch.Tensor  # [B] int32: context length including this step's tokens
    query_lens: torch.Tensor  # [B] int32
    query_starts: torch.Tensor  # [B] int32: first flat token index of each sequence
    max_seq_len: int
    max_query_len: int


def step_tables(meta, page_size: int) -> StepTables:
    """Page tables and lengths for this step, cached on the metadata object (one per step)."""
    store = getattr(meta, "__dict__", {})  # no cache if the metadata ever gets __slots__
    selection = getattr(meta, "context_is_selection", False)
    # A DSA selection's slots are no runs of pages: as a table of one-token pages (slot =
    # table[p] * 1 + 0) the kernels read them as they are, with the page lookup compiled away.
    page_size = 1 if selection else page_size
    cached = store.get("_triton_tables")
    if cached is not None and cached.page_size == page_size:
        return cached
    device = meta.context_slots.device
    slots = meta.context_slots
    if selection:
        tables = slots.to(torch.int32)
    else:
        # The slot at each page's first position names the page (the runner lays
        # slots out as page * page_size + offset).
        tables = torch.div(slots[:, ::page_size], page_size, rounding_mode="floor")
        tables = tables.to(torch.int32)
    starts = [0]
    for n in meta.query_lens[:-1]:
        starts.append(starts[-1] + n)
    lengths = torch.tensor(
        [list(meta.context_lens), list(meta.query_lens), starts], dtype=torch.int32
    ).to(device)
    tables = StepTables(
        page_size=page_size,
        block_tables=tables.contiguous(),
        seq_lens=lengths[0],
        query_lens=lengths[1],
        query_starts=lengths[2],
        max_seq_len=max(meta.context_lens),
        max_query_len=max(meta.query_lens),
    )
    store["_triton_tables"] = tables
    return tables


def min_split_tokens(block_n: int) -> int:
    """The smallest split worth its merge, in whole tiles: MIN_SPLIT_TOKENS, at least one tile."""
    return max(MIN_SPLIT_TOKENS, block_n)


@triton.jit
def split_range(
    seq_len, split, num_splits, fixed_split, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr
):
    """[start, end) of split `split` of a sequence of `seq_len` tokens, in a grid of `num_splits`.

    The sequence uses min(num_splits, ceil(seq_len / MIN_SPLIT)) splits of
    equal whole-tile size (`plan_splits`' rule with the grid's split count in
    place of the GPU-filling one), so a grid planned for a longer context
    (a CUDA graph's capacity) still spreads a short sequence over several
    programs, and splits past its end are empty (start >= end). A
    `fixed_split` > 0 overrides the size for every sequence (tests, benchmarks).
    Mirrored on the host by `sequence_split_tokens`.
    """
    used = tl.maximum(tl.minimum(num_splits, tl.cdiv(seq_len, MIN_SPLIT)), 1)
    per = tl.maximum(tl.cdiv(tl.cdiv(seq_len, used), BLOCK_N) * BLOCK_N, BLOCK_N)
    per = tl.where(fixed_split > 0, fixed_split, per)
    start = split * per
    return start, tl.minimum(start + per, seq_len)


def sequence_split_tokens(length: int, num_splits: int, block_n: int, fixed_split: int = 0) -> int:
    """Tokens per split `split_range` gives a sequence of `length` in a grid of `num_splits`."""
    if fixed_split > 0:
        return fixed_split
    used = max(min(num_splits, triton.cdiv(length, min_split_tokens(block_n))), 1)
    return max(triton.cdiv(triton.cdiv(length, used), block_n) * block_n, block_n)


def plan_splits(
    programs: int, max_len: int, block_n: int, num_sms: int, split_tokens: int | None = None
) -> tuple[int, int]:
    """(number of splits, tokens per split) for split-K decode.

    `programs` is how many programs one split already launches (batch times
    head groups). Long contexts with few programs are cut along the sequence
    until the GPU has about PROGRAMS_PER_SM programs per SM; each split covers
    a whole number of BLOCK_N tiles and at least MIN_SPLIT_TOKENS tokens.
    `split_tokens` fixes the split size instead (rounded up to whole tiles).
    The split count is the launch grid's; the kernels size each sequence's
    splits themselves (`split_range`), so the size returned here is what the
    longest sequence gets at most, and the one `split_tokens` fixes.
    """
    max_len = max(max_len, 1)
    if split_tokens is not None:
        if split_tokens <= 0:
            raise ValueError(
                f"split_tokens must be a positive number of tokens, not {split_tokens}"
            )
        per_split = split_tokens
    else:
        wanted = max(1, -(-PROGRAMS_PER_SM * num_sms // max(programs, 1)))
        most = max(1, -(-max_len // min_split_tokens(block_n)))
        per_split = -(-max_len // min(wanted, most))
    per_split = -(-per_split // block_n) * block_n
    return -(-max_len // per_split), per_split
