"""A decoder layer's small operators as one Triton kernel each: RMSNorm (with the residual add),
SwiGLU and the rotary embedding (issue 28: a decode step the GPU sets the pace of).

In torch each is several launches (RMSNorm about eight: casts, square, mean,
add, rsqrt, products); here each is one pass over its tensor. The arithmetic
is TorchLayerOps' (engine/layers/layer_ops.py), rounding point for rounding
point, so the kernels can stand in for it:

- `rms_norm`: float32 sum of squares, `x * rsqrt(mean + eps)` in float32,
  rounded to the input dtype, then times the weight in the input dtype
  (float32 product, one rounding), as transformers does.
- `rms_norm(..., residual=r)`: `r + x` rounded to the dtype and written to a new
  tensor (the caller's residual is never written), then its norm, in one
  pass: one read of x and residual, one write of each result.
- `silu_mul`: `silu(gate)` rounded to the dtype, then times `up`, rounded.
- `rope_`: in place; cos and sin read from the rotary's float32 tables at
  each token's position and rounded to x's dtype (what `RotaryEmbedding.tables`
  gives torch), each of the four products and the two sums rounded to x's
  dtype, NeoX halves or interleaved pairs, the first `rotary_dim` dims only.

Two things make the kernels round where torch does on a GPU: no contraction
of a product and a sum into one FMA (`enable_fp_fusion=False`; torch's eager
ops round each), and CUDA's own `expf`/`rsqrtf` from libdevice (what torch's
silu and rsqrt call) with IEEE division (`div_rn`). (A float32 product or sum
of two bf16 values rounded to bf16 compiles to one native bf16 instruction:
the same value, as float32 has more than 2 x 8 + 2 bits.) So `silu_mul`, `rope_`
and the residual sum should equal torch bit for bit on a GPU; the norm sums
its squares in another order (a few float32 ulps, which may move a BF16
result by one step). bench/gpu_check.py checks both on real shapes.

Under TRITON_INTERPRET=1 (the CPU tests) libdevice does not exist, so the
kernels call tl.exp / tl.math.rsqrt (numpy's), and the float32 -> bf16 cast
truncates instead of rounding to nearest (DESIGN.md §3): the tests compare
float32 results with torch's and bf16 ones with torch's rounding points made
to truncate (tests/engine/gpu_kernels/test_layer_ops.py).

Inputs are [..., width] with unit stride along the last dimension; rows may
be strided views (the q and k heads of a fused qkv, MLA's latent) and are
read in place. Outputs are new, contiguous tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# A norm's row lives in registers: 16 warps x 32 threads x 32 values. Wider rows
# (no served model has one) go to torch.
MAX_NORM_WIDTH = 16384
NORM_VALUES_PER_WARP = 512  # 16 float32 values per thread per operand
SILU_BLOCK = 1024  # columns per program: 8 bf16 (16 bytes) per thread at 4 warps
ROPE_TILE = 1024  # heads x rotary pairs per program


if interpreting():  # no libdevice in the interpreter: numpy's exp and 1/sqrt

    @triton.jit
    def _exp(x):
        return tl.exp(x)

    @triton.jit
    def _rsqrt(x):
        return tl.math.rsqrt(x)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def _exp(x):
        return libdevice.exp(x)  # __nv_expf: CUDA's expf, what torch's silu calls

    @triton.jit
    def _rsqrt(x):
        return libdevice.rsqrt(x)  # __nv_rsqrtf: what torch.rsqrt calls


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    inner,
    stride_xo,
    stride_xi,
    stride_ro,
    stride_ri,
    width,
    eps,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    # One program per row; rows are (outer, inner) pairs of a [outer, inner, width] view.
    row = tl.program_id(0).to(tl.int64)
    outer, within = row // inner, row % inner
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + outer * stride_xo + within * stride_xi + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + outer * stride_ro + within * stride_ri + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(dtype)  # residual + x, rounded once
        tl.store(res_out_ptr + row * width + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    total = tl.sum(x32 * x32, axis=0)
    mean_square = tl.math.div_rn(total, tl.zeros_like(total) + width)
    normed = (x32 * _rsqrt(mean_square + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = (normed.to(tl.float32) * w.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * width + cols, y, mask=mask)


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, width, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_up_ptr + row * stride_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_row + width + cols, mask=mask, other=0.0)
    silu = tl.math.div_rn(gate, 1.0 + _exp(-gate)).to(dtype)
    y = (silu.to(tl.float32) * up.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * width + cols, y, mask=mask)


@triton.jit
def _rope_kernel(
    x_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    heads,
    half,
    stride_t,
    stride_h,
    stride_table,
    table_rows,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    INTERLEAVED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    # A position outside the table would read out of bounds: leave that token as it is
    # (the runner never makes one; checking on the host would synchronise).
    if (pos >= 0) & (pos < table_rows):
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        i = tl.arange(0, BLOCK_R)
        pair_mask = i < half
        mask = (h < heads)[:, None] & pair_mask[None, :]
        dtype = x_ptr.dtype.element_ty
        # The tables in x's dtype, as RotaryEmbedding.tables hands them to torch.
        cos = tl.load(cos_ptr + pos * stride_table + i, mask=pair_mask, other=0.0)
        sin = tl.load(sin_ptr + pos * stride_table + i, mask=pair_mask, other=0.0)
        cos = cos.to(dtype).to(tl.float32)[None, :]
        sin = sin.to(dtype).to(tl.float32)[None, :]
        if INTERLEAVED:
            first_cols, second_cols = 2 * i, 2 * i + 1
        else:
            first_cols, second_cols = i, i + half
        base = x_ptr + token * stride_t + h[:, None] * stride_h
        first = tl.load(base + first_cols[None, :], mask=mask, other=0.0).to(tl.float32)
        second = tl.load(base + second_cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # torch's eager ops round each product and each sum to x's dtype.
        fc = (first * cos).to(dtype).to(tl.float32)
        ss = (second * sin).to(dtype).to(tl.float32)
        sc = (second * cos).to(dtype).to(tl.float32)
        fs = (first * sin).to(dtype).to(tl.float32)
        tl.store(base + first_cols[None, :], (fc - ss).to(dtype), mask=mask)
        tl.store(base + second_cols[None, :], (sc + fs).to(dtype), mask=mask)


@dataclass(frozen=True)
class NormLaunch:
    block: int  # the row, padded to a power of two
    warps: int


def norm_launch(width: int) -> NormLaunch:
    """The row in one block of registers, 16 float32 values per thread per operand."""
    block = triton.next_power_of_2(width)
    return NormLaunch(block, min(16, max(1, block // NORM_VALUES_PER_WARP)))


def silu_block(width: int) -> int:
    return min(SILU_BLOCK, triton.next_power_of_2(width))


def rope_tiles(half: int) -> tuple[int, int]:
    """(BLOCK_H, BLOCK_R): ROPE_TILE rotary pairs a program, all of each head's.

    The head tile does not follow the head count, so one compiled kernel serves
    every tensor-parallel degree and both of MLA's calls (64 query heads, one
    rope key); a lone head masks the rest of its tile, which costs no memory.
    """
    block_r = triton.next_power_of_2(half)
    return max(1, ROPE_TILE // block_r), block_r


def _check(name: str, t: torch.Tensor) -> None:
    if t.dtype not in KERNEL_DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; the kernels take {KERNEL_DTYPES}")
    if t.dim() == 0 or t.stride(-1) != 1:
        raise ValueError(f"{name} needs a unit stride along its last dimension")


def _same_device(x: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")


def _rows3(x: torch.Tensor) -> torch.Tensor:
    """x [..., width] as [outer, inner, width] without a copy where its strides allow one."""
    if x.dim() == 1:
        return x.view(1, 1, -1)
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() == 3:
        return x
    return x.reshape(-1, x.shape[-2], x.shape[-1])


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """weight * norm(x); with `residual`: (residual + x, weight * norm(residual + x)).

    x (and residual, same shape and dtype) [..., width], weight [width] in x's
    dtype. Both results are new tensors; the inputs are only read.
    """
    _check("x", x)
    width = x.shape[-1]
    if weight.shape != (width,) or weight.dtype != x.dtype or weight.stride(0) != 1:
        raise ValueError(f"weight must be [{width}] in {x.dtype}, got {tuple(weight.shape)} "
                         f"{weight.dtype}")  # fmt: skip
    if width > MAX_NORM_WIDTH:
        raise ValueError(f"rows of {width} values exceed the kernel's {MAX_NORM_WIDTH}")
    _same_device(x, weight=weight)
    if residual is not None:
        _check("residual", residual)
        _same_device(x, residual=residual)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual {tuple(residual.shape)} {residual.dtype} does not match "
                             f"x {tuple(x.shape)} {x.dtype}")  # fmt: skip
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    if x.numel() > 0:
        x3 = _rows3(x)
        r3 = _rows3(residual) if residual is not None else x3
        launch = norm_launch(width)
        _rms_norm_kernel[(x3.shape[0] * x3.shape[1],)](
            x3, r3, weight, out, res_out, x3.shape[1],
            x3.stride(0), x3.stride(1), r3.stride(0), r3.stride(1), width, eps,
            BLOCK=launch.block, HAS_RESIDUAL=residual is not None,
            num_warps=launch.warps, enable_fp_fusion=False,
        )  # fmt: skip
    return out if residual is None else (res_out, out)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of [..., 2 * width] laid out [gate | up] -> [..., width]."""
    _check("gate_up", gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension ({gate_up.shape[-1]}) must be even")
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=gate_up.dtype, device=gate_up.device)
    if out.numel() == 0:
        return out
    rows = gate_up.reshape(-1, 2 * width)  # a view unless the leading dims are not mergeable
    block = silu_block(width)
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, block))](
        rows, out, width, rows.stride(0), BLOCK=block, num_warps=4, enable_fp_fusion=False
    )
    return out


def rope_(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: int,
    interleaved: bool,
) -> None:
    """Rotate x [tokens, heads, head_dim] in place (any token and head strides).

    cos, sin: [positions, rotary_dim / 2] tables (RotaryEmbedding's float32
    buffers); positions: integer [tokens] on x's device.
    """
    _check("x", x)
    if x.dim() != 3:
        raise ValueError(f"x must be [tokens, heads, head_dim], got shape {tuple(x.shape)}")
    tokens, heads, head_dim = x.shape
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and within head_dim {head_dim}")
    half = rotary_dim // 2
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != half:
        raise ValueError(f"cos/sin must be [positions, {half}], got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")  # fmt: skip
    if cos.stride() != sin.stride() or cos.stride(1) != 1:
        raise ValueError("cos and sin must share a layout with unit column stride")
    _same_device(x, positions=positions, cos=cos, sin=sin)
    if positions.shape != (tokens,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be int32/int64 [{tokens}], got "
                         f"{tuple(positions.shape)} {positions.dtype}")  # fmt: skip
    if x.numel() == 0:
        return
    block_h, block_r = rope_tiles(half)
    _rope_kernel[(tokens, triton.cdiv(heads, block_h))](
        x, positions, cos, sin, heads, half, x.stride(0), x.stride(1), cos.stride(0),
        cos.shape[0], BLOCK_H=block_h, BLOCK_R=block_r, INTERLEAVED=interleaved,
        num_warps=4, enable_fp_fusion=False,
    )  # fmt: skip
