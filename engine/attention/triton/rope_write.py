"""Rotary, the Hadamard K/V rotation and the KV write of a GQA layer, as one kernel.

Unfused, a GQA layer's step runs three passes over q, k and v before its
attention (issue 28, item 4): the rotary embedding on q and k (a layer op),
the run-time Hadamard rotation of q, k and v (engine/kv/rotation.py, one
float32 product cast back) and the KV write (kv_write.py: quantize k and v
and store them at their slots). Here one program reads BLOCK_T tokens of one
head once, rotates them (rotary for q and k heads, never v), multiplies by H
(tl.dot: tensor cores for bf16/fp16), writes the rotated q heads to a new [T, Hq, D] tensor and
quantizes and stores the k and v heads at `slots[t]` (a negative slot is a
padding token: nothing is stored). The grid is (token tiles, Hq + 2 Hkv heads):
a program's head decides its role, so each program runs one branch.

Arithmetic, and where it meets the unfused path:
- Rotary: the torch layer op's rounding points (engine/gpu_kernels/layer_ops.py
  `rope_`): the tables rounded to the activation dtype, each product and each
  sum rounded to it, NeoX halves or interleaved pairs of the first
  `rotary_dim` dims; the other dims pass through. Bit-equal to torch.
- Rotation: x @ blockdiag(H). H's Sylvester entries are ±1/sqrt(block); the
  kernel multiplies by the exact ±1 signs (computed in registers from the bit
  parity of row & column, no matrix in memory) with float32 accumulation and
  applies 1/sqrt(block) once after. Torch sums float32 products x·fp32(±1/√b)
  in its own order, so the two float32 results differ by a few float32 ulps
  and, rounded to the activation dtype, are equal or one step apart (the
  tests bound it). The rotated values are then rounded to the activation
  dtype, as `HadamardRotation.rotate` casts its product back before the
  unfused write, so K/V storage gets the same bytes whenever the rounded
  values agree, and otherwise at most one e4m3 step apart.
- FP8 write: `round_to_e4m3(div_rn(x, scale))`, torch's clamp-and-cast
  (engine/kv/quant.py) computed in fp32 arithmetic, so the interpreter, whose
  e4m3 cast rounds wrongly, stores torch's bytes too (DESIGN.md §3). BF16 (or
  float32) pages store the value cast to the storage dtype, as the pool does.

Under TRITON_INTERPRET=1 the float32 -> bf16 cast truncates; `_round` rounds
to nearest even in integer arithmetic there (exact values then convert
exactly), and is the plain cast on a GPU. The kernel reads no device value on
the host, so a CUDA graph can hold it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting
from engine.attention.triton.common import dot_config, round_to_e4m3

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SMALL_STEP_TOKENS = 64  # steps up to this many tokens (decode) use the small token tile


if interpreting():

    @triton.jit
    def _round(x, dtype: tl.constexpr):
        """fp32 x rounded to `dtype` (nearest even): bf16 by integer arithmetic, as the
        interpreter's own bf16 cast truncates; NaN stays NaN."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.int32, bitcast=True)
            lsb = (bits >> 16) & 1
            rounded = ((bits + 0x7FFF + lsb) & -65536).to(tl.float32, bitcast=True)
            return tl.where(x != x, x, rounded).to(tl.bfloat16)
        else:
            return x.to(dtype)

else:

    @triton.jit
    def _round(x, dtype: tl.constexpr):
        return x.to(dtype)  # round to nearest even on a GPU


@triton.jit
def _to_act(x, ACT: tl.constexpr):
    """fp32 values rounded to the activation dtype, kept in fp32 for further arithmetic."""
    return _round(x, ACT).to(tl.float32)


@triton.jit
def _hadamard_signs(rows, row_mask, cols, HEAD_DIM: tl.constexpr, ROT_BLOCK: tl.constexpr, DOT):
    """[R, C] tile of sqrt(ROT_BLOCK) * blockdiag(H): the Sylvester sign (-1)^popcount(r & c)
    inside a diagonal block, 0 elsewhere and on masked rows; exact in any dot dtype."""
    r = rows[:, None]
    c = cols[None, :]
    p = r & c & (ROT_BLOCK - 1)
    # Fold the bits onto bit 0: its value is then the parity of the block-local bits.
    if ROT_BLOCK > 256:
        p = p ^ (p >> 8)
    if ROT_BLOCK > 16:
        p = p ^ (p >> 4)
    if ROT_BLOCK > 4:
        p = p ^ (p >> 2)
    if ROT_BLOCK > 1:
        p = p ^ (p >> 1)
    sign = 1.0 - 2.0 * (p & 1).to(tl.float32)
    inside = ((r // ROT_BLOCK) == (c // ROT_BLOCK)) & (r < HEAD_DIM) & (c < HEAD_DIM)
    return tl.where(inside & row_mask[:, None], sign, 0.0).to(DOT)


@triton.jit
def _store_cols(x, dst_rows, row_mask, cols, col_mask, scale, QUANTIZE: tl.constexpr):
    """Store fp32 tile x (values of the activation dtype) at dst_rows[:, None] + cols:
    quantized to e4m3 bytes by `scale`, or cast to the destination's dtype."""
    ptrs = dst_rows[:, None] + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if QUANTIZE:
        scaled = tl.math.div_rn(x, tl.zeros_like(x) + scale)
        y = round_to_e4m3(scaled).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        y = _round(x, ptrs.dtype.element_ty)
    tl.store(ptrs, y, mask=mask)


@triton.jit
def _head_scale(scale_ptr, head, IS_FP8: tl.constexpr):
    if IS_FP8:
        return tl.load(scale_ptr + head)
    else:
        return 1.0  # not read: BF16 pages store the values themselves


@triton.jit
def _rope_rotate_store(
    src,
    stride_t,
    rows,
    row_mask,
    cos,
    sin,
    dst_rows,
    dst_mask,
    scale,
    rotation_scale,
    APPLY_ROPE: tl.constexpr,
    QUANTIZE: tl.constexpr,
    ROTATE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    ROT_BLOCK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ACT: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One head's rows [BLOCK_T, HEAD_DIM] from `src`: rotary (APPLY_ROPE), then @ H (ROTATE),
    rounded to the activation dtype and stored at `dst_rows` (masked by `dst_mask`)."""
    base = src + rows[:, None].to(tl.int64) * stride_t
    all_cols = tl.arange(0, BLOCK_D)
    if APPLY_ROPE:
        half: tl.constexpr = ROTARY_DIM // 2
        i = tl.arange(0, BLOCK_R)
        pair_mask = i < half
        if INTERLEAVED:
            first_cols, second_cols = 2 * i, 2 * i + 1
        else:
            first_cols, second_cols = i, i + half
        mask = row_mask[:, None] & pair_mask[None, :]
        first = tl.load(base + first_cols[None, :], mask=mask, other=0.0).to(tl.float32)
        second = tl.load(base + second_cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # Each product and each sum rounded to the activation dtype, as torch's eager ops.
        fc = _to_act(first * cos, ACT)
        ss = _to_act(second * sin, ACT)
        sc = _to_act(second * cos, ACT)
        fs = _to_act(first * sin, ACT)
        first = _to_act(fc - ss, ACT)
        second = _to_act(sc + fs, ACT)
        rest_cols = ROTARY_DIM + tl.arange(0, BLOCK_P)
        rest_mask = rest_cols < HEAD_DIM
        rest = tl.load(
            base + rest_cols[None, :], mask=row_mask[:, None] & rest_mask[None, :], other=0.0
        ).to(tl.float32)
        if ROTATE:
            # x @ H as the sum over the three column groups of x's rows of H.
            signs = _hadamard_signs(first_cols, pair_mask, all_cols, HEAD_DIM, ROT_BLOCK, DOT)
            acc = tl.dot(first.to(DOT), signs, input_precision=PRECISION)
            signs = _hadamard_signs(second_cols, pair_mask, all_cols, HEAD_DIM, ROT_BLOCK, DOT)
            acc = tl.dot(second.to(DOT), signs, acc, input_precision=PRECISION)
            if ROTARY_DIM < HEAD_DIM:
                signs = _hadamard_signs(rest_cols, rest_mask, all_cols, HEAD_DIM, ROT_BLOCK, DOT)
                acc = tl.dot(rest.to(DOT), signs, acc, input_precision=PRECISION)
            rotated = _to_act(acc * rotation_scale, ACT)
            _store_cols(rotated, dst_rows, dst_mask, all_cols, all_cols < HEAD_DIM, scale, QUANTIZE)
        else:
            _store_cols(first, dst_rows, dst_mask, first_cols, pair_mask, scale, QUANTIZE)
            _store_cols(second, dst_rows, dst_mask, second_cols, pair_mask, scale, QUANTIZE)
            if ROTARY_DIM < HEAD_DIM:
                _store_cols(rest, dst_rows, dst_mask, rest_cols, rest_mask, scale, QUANTIZE)
    else:
        col_mask = all_cols < HEAD_DIM
        x = tl.load(base + all_cols[None, :], mask=row_mask[:, None] & col_mask[None, :],
                    other=0.0).to(tl.float32)  # fmt: skip
        if ROTATE:
            signs = _hadamard_signs(all_cols, col_mask, all_cols, HEAD_DIM, ROT_BLOCK, DOT)
            acc = tl.dot(x.to(DOT), signs, input_precision=PRECISION)
            x = _to_act(acc * rotation_scale, ACT)
        _store_cols(x, dst_rows, dst_mask, all_cols, col_mask, scale, QUANTIZE)


@triton.jit
def _rope_rotate_write_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    dst_ptr,
    k_scale_ptr,
    v_scale_ptr,
    tokens,
    q_heads,
    kv_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_table,
    table_rows,
    rotation_scale,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    ROT_BLOCK: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ROTATE: tl.constexpr,
    IS_FP8: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_mask = rows < tokens
    act = q_ptr.dtype.element_ty
    # Each row's cos/sin at its position, in the activation dtype (RotaryEmbedding.tables).
    # A position outside the table (the runner never makes one; checking on the host would
    # synchronise) gets cos 1, sin 0: that token is not rotated, and nothing is read out of
    # bounds.
    pos = tl.load(pos_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    in_table = row_mask & (pos >= 0) & (pos < table_rows)
    i = tl.arange(0, BLOCK_R)
    table_mask = in_table[:, None] & (i < ROTARY_DIM // 2)[None, :]
    table_offsets = pos[:, None] * stride_table + i[None, :]
    cos = _to_act(tl.load(cos_ptr + table_offsets, mask=table_mask, other=1.0).to(tl.float32), act)
    sin = _to_act(tl.load(sin_ptr + table_offsets, mask=table_mask, other=0.0).to(tl.float32), act)
    if head < q_heads:
        q_rows = q_out_ptr + (rows.to(tl.int64) * q_heads + head) * HEAD_DIM
        _rope_rotate_store(
            q_ptr + head * stride_qh, stride_qt, rows, row_mask, cos, sin, q_rows, row_mask,
            1.0, rotation_scale, True, False, ROTATE, HEAD_DIM, ROTARY_DIM, ROT_BLOCK,
            INTERLEAVED, BLOCK_R, BLOCK_P, BLOCK_D, act, DOT, PRECISION,
        )  # fmt: skip
    else:
        # K and V of one token share a storage row [2, kv_heads, HEAD_DIM] at its slot.
        slot = tl.load(slots_ptr + rows, mask=row_mask, other=-1).to(tl.int64)
        written = slot >= 0
        kv_head = head - q_heads
        if kv_head < kv_heads:
            dst_rows = dst_ptr + (slot * 2 * kv_heads + kv_head) * HEAD_DIM
            scale = _head_scale(k_scale_ptr, kv_head, IS_FP8)
            _rope_rotate_store(
                k_ptr + kv_head * stride_kh, stride_kt, rows, row_mask, cos, sin, dst_rows,
                written, scale, rotation_scale, True, IS_FP8, ROTATE, HEAD_DIM, ROTARY_DIM,
                ROT_BLOCK, INTERLEAVED, BLOCK_R, BLOCK_P, BLOCK_D, act, DOT, PRECISION,
            )  # fmt: skip
        else:
            kv_head -= kv_heads
            dst_rows = dst_ptr + (slot * 2 * kv_heads + kv_heads + kv_head) * HEAD_DIM
            scale = _head_scale(v_scale_ptr, kv_head, IS_FP8)
            _rope_rotate_store(
                v_ptr + kv_head * stride_vh, stride_vt, rows, row_mask, cos, sin, dst_rows,
                written, scale, rotation_scale, False, IS_FP8, ROTATE, HEAD_DIM, ROTARY_DIM,
                ROT_BLOCK, INTERLEAVED, BLOCK_R, BLOCK_P, BLOCK_D, act, DOT, PRECISION,
            )  # fmt: skip


def rope_write_tiles(tokens: int) -> tuple[int, int]:
    """(BLOCK_T, warps): 16 tokens a program for decode-sized steps (tl.dot's smallest tile;
    more programs for a small batch), 64 for prefill chunks, where each program builds H's
    signs for four times the rows."""
    if tokens <= SMALL_STEP_TOKENS:
        return 16, 4
    return 64, 8


def input_problem(q, k, v, positions, cos, sin, rotary_dim, rotation_block, storage) -> str | None:
    """Why `rope_rotate_write` cannot take these inputs, or None when it can."""
    if q.dim() != 3 or q.dtype not in KERNEL_DTYPES:
        return f"q must be [tokens, heads, head_dim] in {KERNEL_DTYPES}, not {q.dtype} {q.shape}"
    tokens, _, head_dim = q.shape
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3 or t.shape[0] != tokens or t.shape[2] != head_dim or t.dtype != q.dtype:
            return (
                f"{name} must be [{tokens}, heads, {head_dim}] {q.dtype}, not {t.dtype} {t.shape}"
            )
        if t.stride(2) != 1:
            return f"{name} needs a unit stride along head_dim"
    kv_heads = k.shape[1]
    if v.shape != k.shape:
        return f"k {tuple(k.shape)} and v {tuple(v.shape)} differ"
    if storage.dim() != 4 or storage.shape[1:] != (2, kv_heads, head_dim):
        return f"storage must be [slots, 2, {kv_heads}, {head_dim}], got {tuple(storage.shape)}"
    if storage.dtype not in (torch.uint8, *KERNEL_DTYPES) or not storage.is_contiguous():
        return f"storage must be contiguous uint8 (FP8) or {KERNEL_DTYPES}, got {storage.dtype}"
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        return f"rotary_dim {rotary_dim} must be even and within head_dim {head_dim}"
    half = rotary_dim // 2
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != half:
        return f"cos/sin must be [positions, {half}], got {tuple(cos.shape)}, {tuple(sin.shape)}"
    if cos.dtype not in KERNEL_DTYPES or cos.stride() != sin.stride() or cos.stride(1) != 1:
        return "cos and sin must be float tables sharing a layout with unit column stride"
    if positions.shape != (tokens,) or positions.dtype not in (torch.int32, torch.int64):
        return f"positions must be int32/int64 [{tokens}], not {positions.dtype} {positions.shape}"
    if rotation_block is not None and (
        rotation_block < 1 or rotation_block & (rotation_block - 1) or head_dim % rotation_block
    ):
        return (
            f"rotation block {rotation_block} must be a power of two dividing head_dim {head_dim}"
        )
    for name, t in (("k", k), ("v", v), ("positions", positions), ("cos", cos), ("sin", sin),
                    ("storage", storage)):  # fmt: skip
        if t.device != q.device:
            return f"{name} is on {t.device}, q on {q.device}"
    return None


def fused_rope_write_applies(q, k, v, positions, rotary, rotation, storage) -> bool:
    """Whether `rope_rotate_write` takes this layer's step with its rotary embedding
    (RotaryTables: rotary_dim, interleaved, cos, sin) and K/V rotation (None or a
    HadamardRotation); its checks include those `GpuLayerOps.rope_` makes for the rotary
    kernel. Where it does not, the caller runs rotary, rotation and write as before."""
    block = None
    if rotation is not None:
        if (
            getattr(rotation, "batch_invariant", True)
            or getattr(rotation, "dim", None) != q.shape[-1]
        ):
            return False  # deterministic mode's butterflies, or a rotation of another size
        block = rotation.block
    cos, sin = getattr(rotary, "cos", None), getattr(rotary, "sin", None)
    if not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor):
        return False
    return input_problem(q, k, v, positions, cos, sin, rotary.rotary_dim, block, storage) is None


def rope_rotate_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: int,
    interleaved: bool,
    rotation_block: int | None,
    storage: torch.Tensor,
    slots: torch.Tensor,
    k_scales: torch.Tensor | None,
    v_scales: torch.Tensor | None,
) -> torch.Tensor:
    """Rotary on q and k, (blockdiag Hadamard of `rotation_block` on q, k and v,) and K/V into
    one layer's storage at their slots; returns the rotated q [T, Hq, D] (a new tensor).

    q [T, Hq, D], k and v [T, Hkv, D]: bf16, fp16 or fp32 with a unit stride along D (views
    of a fused qkv are read in place). positions [T] int32/int64; cos, sin the rotary's
    [positions, rotary_dim / 2] tables. storage [slots, 2, Hkv, D] contiguous: uint8 e4m3
    bytes (FP8 pages, with float32 [Hkv] `k_scales` and `v_scales`) or a float dtype.
    slots [T]: a negative slot stores nothing. `rotation_block` None: no rotation.
    """
    problem = input_problem(q, k, v, positions, cos, sin, rotary_dim, rotation_block, storage)
    if problem is None and slots.shape != positions.shape:
        problem = f"slots must be [{q.shape[0]}], got {tuple(slots.shape)}"
    if problem is None and storage.dtype == torch.uint8 and (k_scales is None or v_scales is None):
        problem = "FP8 storage needs K and V scales"
    if problem is not None:
        raise ValueError(problem)
    tokens, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q_out = torch.empty(tokens, q_heads, head_dim, dtype=q.dtype, device=q.device)
    if tokens == 0:
        return q_out
    if k_scales is None:  # any float32 tensor: the kernel reads no scale for float pages
        k_scales = v_scales = torch.ones(1, dtype=torch.float32, device=q.device)
    # The kernel reads positions and slots at unit stride (no-ops for the runner's tensors).
    positions, slots = positions.contiguous(), slots.contiguous()
    block_t, warps = rope_write_tiles(tokens)
    dot, precision = dot_config(q.dtype)
    _rope_rotate_write_kernel[(triton.cdiv(tokens, block_t), q_heads + 2 * kv_heads)](
        q, k, v, q_out, positions, cos, sin, slots, storage, k_scales, v_scales,
        tokens, q_heads, kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), cos.shape[0], (rotation_block or 1) ** -0.5,
        HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim, ROT_BLOCK=rotation_block or 1,
        INTERLEAVED=interleaved, ROTATE=rotation_block is not None,
        IS_FP8=storage.dtype == torch.uint8, BLOCK_T=block_t,
        BLOCK_R=max(16, triton.next_power_of_2(rotary_dim // 2)),
        BLOCK_P=max(16, triton.next_power_of_2(max(head_dim - rotary_dim, 1))),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT=dot, PRECISION=precision, num_warps=warps,
        enable_fp_fusion=False,  # torch rounds each rotary product and sum on its own
    )  # fmt: skip
    return q_out
