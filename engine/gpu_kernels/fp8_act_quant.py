"""Per-token, per-group FP8 quantization of activations (DeepSeek V3's recipe for FP8-block GEMMs).

For each row and each group of 128 consecutive columns: `scale = max(amax,
1e-10) / 448` (float32), values `clamp(x / scale, -448, 448)` cast to e4m3
(round to nearest even). A partial last group takes the columns that exist.
The GEMMs then multiply e4m3 activations by e4m3 weights and apply
`act_scale[row, group] * weight_scale_inv[block]` to each fp32 partial
product (fp8_block_gemm.py, fused_moe.py).

`quantize_activations_reference` is the torch definition (torch's casts are
the reference for FP8, DESIGN.md §3). Both compute the same float32
operations: `scale = amax / 448` and `x / scale`, each one IEEE division
rounded to nearest (div_rn in the kernel), so on a GPU the kernel's bytes and
scales equal the reference's. The reference divides by tensors, never by a
Python number: CUDA torch computes `t / 448.0` as `t * (1 / 448.0)`, one
rounding more, which made its scales differ from the kernel's in the last
bit on an H200 (and moved 2 of 7,168 bytes at 1 x 7168).

Under TRITON_INTERPRET=1 the kernel's float->e4m3 cast is wrong (it drops
the carry when rounding up crosses a power of two, -1.9453 -> -1.0, and
flushes e4m3 subnormals to zero), so `quantize_activations`,
the entry point the GEMM wrappers use, runs the torch reference on CPU and
the kernel only on CUDA tensors; the interpreter tests check the kernel's
scales on any input and its values on inputs that need no rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton.target import on_gpu
from engine.gpu_kernels.layout import (
    ACT_AMAX_EPS,
    FLOAT_ACTS,
    FP8_BLOCK,
    cdiv,
    check_tensor,
    dense_last,
)
from engine.kv.quant import FP8_DTYPE, FP8_MAX

FP8_MAX_VALUE = tl.constexpr(FP8_MAX)
AMAX_EPS = tl.constexpr(ACT_AMAX_EPS)
ELEMENTS_PER_PROGRAM = 1024  # BLOCK_G groups of GROUP values: enough work per program


@triton.jit
def _act_quant_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    K,
    num_groups,
    stride_xm,
    stride_qm,
    stride_sm,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    # One program: BLOCK_G consecutive groups of one row, as a [BLOCK_G, GROUP] tile,
    # so the per-group maximum is one row-wise reduction.
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = (g[:, None] < num_groups) & (cols < K)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), 1), AMAX_EPS)
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX_VALUE, tl.float32))
    scaled = tl.math.div_rn(x, scale[:, None])
    scaled = tl.minimum(tl.maximum(scaled, -FP8_MAX_VALUE), FP8_MAX_VALUE)
    q = scaled.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    tl.store(q_ptr + row * stride_qm + cols, q, mask=mask)
    tl.store(s_ptr + row * stride_sm + g, scale, mask=g < num_groups)


def _check(x: torch.Tensor, group: int) -> None:
    check_tensor("x", x, 2, FLOAT_ACTS, x.device)
    if group < 16 or group & (group - 1):
        raise ValueError(f"group must be a power of two >= 16, got {group}")


def groups_per_program(groups: int, group: int) -> int:
    """BLOCK_G: the groups of one row a program quantizes (a power of two)."""
    return max(1, min(triton.next_power_of_2(groups), ELEMENTS_PER_PROGRAM // group))


def quantize_activations_reference(
    x: torch.Tensor, group: int = FP8_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (float8_e4m3fn [M, K], float32 scales [M, ceil(K/group)]), in torch."""
    _check(x, group)
    m, k = x.shape
    groups = cdiv(k, group)
    padded = x.new_zeros(m, groups * group, dtype=torch.float32)
    padded[:, :k] = x.float()
    blocks = padded.view(m, groups, group)
    amax = blocks.abs().amax(dim=-1).clamp_min(ACT_AMAX_EPS)
    # Tensor / tensor is IEEE division on CPU and CUDA alike (see the module doc).
    scales = amax / torch.full_like(amax, FP8_MAX)
    values = (blocks / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values.view(m, groups * group)[:, :k].contiguous(), scales


def quantize_activations_triton(
    x: torch.Tensor, group: int = FP8_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel for `quantize_activations_reference` (exact on a GPU; see the module doc)."""
    _check(x, group)
    m, k = x.shape
    groups = cdiv(k, group)
    values = torch.empty(m, k, dtype=FP8_DTYPE, device=x.device)
    scales = torch.empty(m, groups, dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return values, scales
    x = dense_last(x)
    block_g = groups_per_program(groups, group)
    grid = (m, triton.cdiv(groups, block_g))
    _act_quant_kernel[grid](
        x,
        values.view(torch.uint8),
        scales,
        k,
        groups,
        x.stride(0),
        values.stride(0),
        scales.stride(0),
        GROUP=group,
        BLOCK_G=block_g,
    )
    return values, scales


def quantize_activations(
    x: torch.Tensor, group: int = FP8_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel on GPU tensors; torch's reference elsewhere (the interpreter's cast is wrong)."""
    if on_gpu(x):
        return quantize_activations_triton(x, group)
    return quantize_activations_reference(x, group)
