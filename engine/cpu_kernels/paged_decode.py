"""Decode attention that reads the paged GQA cache in place (paged_decode.c)."""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library

MAX_HEAD_DIM = 256
_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.uint8: 2, torch.float8_e4m3fn: 2}


def supports(storage: torch.Tensor, head_dim: int) -> bool:
    """Whether the kernel reads this layer storage [slots, 2, kv_heads, head_dim]."""
    return (
        storage.device.type == "cpu"
        and storage.dtype in _KINDS
        and storage.is_contiguous()
        and head_dim % 16 == 0
        and head_dim <= MAX_HEAD_DIM
    )


def paged_decode(
    q: torch.Tensor,
    storage: torch.Tensor,
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    k_factor: torch.Tensor,
    v_factor: torch.Tensor,
    softmax_scale: float,
) -> torch.Tensor:
    """q [B, Hq, D] -> out [B, Hq, D] in q's dtype.

    storage: one layer's [slots, 2, Hkv, D] cache; context_slots [B, L] int64
    (row b valid up to context_lens[b] >= 1); k_factor and v_factor float32
    [Hkv]: the true K and V are the stored values (FP8 bytes read as
    value * 2**-8) times them.
    """
    batch, q_heads, head_dim = q.shape
    kv_heads = storage.shape[2]
    if q.dtype not in (torch.float32, torch.bfloat16):
        q = q.float()
    q = q.contiguous()
    out = torch.empty_like(q)
    is_bf16 = int(q.dtype == torch.bfloat16)
    status = library().paged_decode(
        q.data_ptr(),
        is_bf16,
        storage.data_ptr(),
        _KINDS[storage.dtype],
        context_slots.data_ptr(),
        context_lens.data_ptr(),
        batch,
        context_slots.shape[1],
        q_heads,
        kv_heads,
        head_dim,
        k_factor.data_ptr(),
        v_factor.data_ptr(),
        float(softmax_scale),
        out.data_ptr(),
        is_bf16,
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("paged_decode could not allocate its scratch buffers")
    return out
