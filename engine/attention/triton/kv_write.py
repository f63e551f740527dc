"""Store new tokens' K/V (GQA) or latent rows (MLA) at their cache slots, quantizing to FP8.

One program per token writes two sources into one storage row: K and V into
`[2, kv_heads, head_dim]` for GQA, the latent and the rope key into
`[lora_rank + rope_dim]` for MLA. FP8 quantization matches engine.kv.quant:
`clamp(x / scale, -448, 448)` then round to nearest e4m3, so it saturates
where torch's bare cast would give NaN (DESIGN.md §3). Each source has a
scale per group of columns: per KV head for GQA (a per-tensor scale is
repeated per head, so per-head scales need nothing new), one for each MLA
part. A negative slot marks a padding token: nothing is written.

The division is IEEE round-to-nearest (div_rn), as torch's, so on a GPU the
stored bytes equal torch's. Under TRITON_INTERPRET=1 the e4m3 cast drops the
carry when rounding up crosses a power of two (7.87 -> 4.0), so there only
values that are exact in e4m3 round-trip exactly; tests say so.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton.common import FP8_MAX_VALUE


@triton.jit
def _store_part(
    src_ptr,
    scale_ptr,
    dst_row_ptr,
    token,
    stride_t,
    stride_g,
    WIDTH: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    cols = tl.arange(0, BLOCK)
    mask = cols < WIDTH
    group = cols // GROUP
    x = tl.load(src_ptr + token * stride_t + group * stride_g + cols % GROUP, mask=mask, other=0.0)
    if IS_FP8:
        scale = tl.load(scale_ptr + group, mask=mask, other=1.0)
        scaled = tl.math.div_rn(x.to(tl.float32), scale)
        scaled = tl.minimum(tl.maximum(scaled, -FP8_MAX_VALUE), FP8_MAX_VALUE)
        y = scaled.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        y = x.to(dst_row_ptr.dtype.element_ty)
    tl.store(dst_row_ptr + cols, y, mask=mask)


@triton.jit
def _write_pair_kernel(
    a_ptr,
    b_ptr,
    slots_ptr,
    dst_ptr,
    a_scale_ptr,
    b_scale_ptr,
    stride_a_t,
    stride_a_g,
    stride_b_t,
    stride_b_g,
    stride_dst,
    B_OFFSET: tl.constexpr,
    A_WIDTH: tl.constexpr,
    A_GROUP: tl.constexpr,
    BLOCK_A: tl.constexpr,
    B_WIDTH: tl.constexpr,
    B_GROUP: tl.constexpr,
    BLOCK_B: tl.constexpr,
    IS_FP8: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    if slot < 0:
        return
    row = dst_ptr + slot * stride_dst
    _store_part(
        a_ptr, a_scale_ptr, row, token, stride_a_t, stride_a_g, A_WIDTH, A_GROUP, BLOCK_A, IS_FP8
    )
    _store_part(
        b_ptr,
        b_scale_ptr,
        row + B_OFFSET,
        token,
        stride_b_t,
        stride_b_g,
        B_WIDTH,
        B_GROUP,
        BLOCK_B,
        IS_FP8,
    )


def _rows(x: torch.Tensor, group: int) -> tuple[torch.Tensor, int, int]:
    """x as [T, groups, group] strides (token, group); the innermost dimension must be dense."""
    x = x.reshape(x.shape[0], -1, group)  # a view whenever the layout allows one
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1)


def write_pair(
    dst: torch.Tensor,
    slots: torch.Tensor,
    a: torch.Tensor,
    a_group: int,
    a_scales: torch.Tensor | None,
    b: torch.Tensor,
    b_group: int,
    b_scales: torch.Tensor | None,
) -> None:
    """Write rows `[a | b]` of every token t at dst[slots[t]] (dst: [slots, row] of one layer).

    `a` [T, ...] is flattened per token into groups of `a_group` values, one
    float32 scale each (`a_scales`, needed when dst is uint8 FP8 storage);
    likewise `b`, stored right after `a` in the row.
    """
    tokens = slots.shape[0]
    if tokens == 0:
        return
    is_fp8 = dst.dtype == torch.uint8
    if is_fp8 and (a_scales is None or b_scales is None):
        raise ValueError("FP8 storage needs scales for both parts")
    a_rows, stride_a_t, stride_a_g = _rows(a, a_group)
    b_rows, stride_b_t, stride_b_g = _rows(b, b_group)
    a_width, b_width = a_rows.shape[1] * a_group, b_rows.shape[1] * b_group
    row_width = dst[0].numel()
    if a_width + b_width != row_width:
        raise ValueError(f"parts of {a_width} + {b_width} values do not fill a row of {row_width}")
    if a_scales is None:  # any float32 tensor: the kernel does not read it for non-FP8 storage
        a_scales = b_scales = torch.ones(1, dtype=torch.float32, device=dst.device)
    _write_pair_kernel[(tokens,)](
        a_rows,
        b_rows,
        slots,
        dst,
        a_scales,
        b_scales,
        stride_a_t,
        stride_a_g,
        stride_b_t,
        stride_b_g,
        dst.stride(0),
        B_OFFSET=a_width,
        A_WIDTH=a_width,
        A_GROUP=a_group,
        BLOCK_A=triton.next_power_of_2(a_width),
        B_WIDTH=b_width,
        B_GROUP=b_group,
        BLOCK_B=triton.next_power_of_2(b_width),
        IS_FP8=is_fp8,
    )


def write_gqa(
    storage: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scales: torch.Tensor | None,
    v_scales: torch.Tensor | None,
) -> None:
    """K and V [T, kv_heads, head_dim] into one layer's storage [slots, 2, kv_heads, head_dim]."""
    if storage.dim() != 4 or not storage.is_contiguous():
        raise ValueError("expected one layer's contiguous [slots, 2, kv_heads, head_dim] storage")
    head_dim = storage.shape[-1]
    write_pair(
        storage.view(storage.shape[0], -1), slots, k, head_dim, k_scales, v, head_dim, v_scales
    )


def write_mla(
    storage: torch.Tensor,
    slots: torch.Tensor,
    latent: torch.Tensor,
    rope: torch.Tensor,
    scales: torch.Tensor | None,
) -> None:
    """Latent [T, lora_rank] and rope key [T, rope_dim] into one layer's rows [slots, latent_dim].

    `scales`: float32 [2] (latent, rope) on the storage's device; None for BF16 rows.
    """
    latent_scale, rope_scale = (None, None) if scales is None else (scales[0:1], scales[1:2])
    write_pair(
        storage, slots, latent, latent.shape[-1], latent_scale, rope, rope.shape[-1], rope_scale
    )
