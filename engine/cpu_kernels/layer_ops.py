"""Norm, SwiGLU, Hadamard rotation and rotary embedding on BF16 CPU tensors (layer_ops.c).

Each takes contiguous bfloat16 tensors (rope and hadamard a row stride, for
views into a fused qkv tensor) and does in one call what torch does in
several small operators, with torch's rounding points.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library

MAX_HADAMARD_BLOCK = 1024


def _check(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.bfloat16 or x.device.type != "cpu":
        raise ValueError(f"{name} takes bfloat16 CPU tensors")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """weight * norm(x), or with `residual`: residual += x (in place), then its norm."""
    _check(x, "rms_norm")
    x = x.contiguous()
    out = torch.empty_like(x)
    hidden = x.shape[-1]
    if residual is not None and not residual.is_contiguous():
        raise ValueError("rms_norm updates the residual in place: it must be contiguous")
    library().rms_norm(
        x.data_ptr(),
        None if residual is None else residual.data_ptr(),
        weight.contiguous().data_ptr(),
        eps,
        out.data_ptr(),
        x.numel() // hidden,
        hidden,
        torch.get_num_threads(),
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on [..., 2 * width] laid out as [gate | up]."""
    _check(gate_up, "silu_mul")
    gate_up = gate_up.contiguous()
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=gate_up.dtype)
    library().silu_mul(
        gate_up.data_ptr(),
        out.data_ptr(),
        gate_up.numel() // (2 * width),
        width,
        torch.get_num_threads(),
    )
    return out


def hadamard_(x: torch.Tensor, block: int, gain: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, ..., dim] (last two dims contiguous, rows strided) rotated in place;
    `gain` (float32 [dim], optional) multiplies the columns first, in float32. BF16
    values are rounded back once; float32 ones (a weight folded at load) stay float32."""
    if x.dtype not in (torch.bfloat16, torch.float32) or x.device.type != "cpu":
        raise ValueError("hadamard takes bfloat16 or float32 CPU tensors")
    rows_view = x.reshape(x.shape[0], -1) if x.dim() > 2 else x
    if rows_view.stride(-1) != 1 or block > MAX_HADAMARD_BLOCK or block & (block - 1):
        raise ValueError("hadamard needs unit-stride rows and a power-of-two block <= 1024")
    if gain is not None:
        gain = gain.detach().to(torch.float32).contiguous()
        if gain.shape != (rows_view.shape[1],):
            raise ValueError(f"hadamard's gain must be [{rows_view.shape[1]}] float32")
    kernel = library().hadamard_f32 if x.dtype == torch.float32 else library().hadamard
    kernel(
        rows_view.data_ptr(),
        rows_view.shape[0],
        rows_view.shape[1],
        rows_view.stride(0),
        block,
        None if gain is None else gain.data_ptr(),
        torch.get_num_threads(),
    )
    return x


def rope_(
    x: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rot_dim: int,
    interleaved: bool,
) -> None:
    """Rotary embedding in place on the first rot_dim values of each head of x [tokens,
    heads, dims] (dims contiguous; heads at a fixed stride of at least dims, so MLA's
    q_rope, the tail of each q head, is taken as it lies).

    cos and sin: float32 [max_positions, rot_dim / 2] tables; positions int64 [tokens].
    """
    _check(x, "rope")
    tokens, heads, dims = x.shape
    head_step = x.stride(1) if heads > 1 else dims  # the kernel's head_dim: head to head
    if x.stride(2) != 1 or head_step < dims or rot_dim > dims:
        raise ValueError("rope needs each head's values contiguous, heads apart")
    library().rope(
        x.data_ptr(),
        tokens,
        heads,
        head_step,
        x.stride(0),
        positions.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        rot_dim,
        int(interleaved),
        torch.get_num_threads(),
    )
