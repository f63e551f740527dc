"""Decode attention that reads the paged GQA cache in place, and the write of new K/V
into it (paged_decode.c, kv_write.c)."""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library

MAX_HEAD_DIM = 256
KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.uint8: 2, torch.float8_e4m3fn: 2}


def supports(storage: torch.Tensor, head_dim: int) -> bool:
    """Whether the kernel reads this layer storage [slots, 2, kv_heads, head_dim]."""
    return (
        storage.device.type == "cpu"
        and storage.dtype in KV_KINDS
        and storage.is_contiguous()
        and head_dim % 16 == 0
        and head_dim <= MAX_HEAD_DIM
    )


def _heads_contiguous(x: torch.Tensor) -> bool:
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def kv_write(
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
    storage: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> bool:
    """Store k, v [tokens, kv_heads, D] at `slots` of one layer's storage, quantizing to
    FP8 with the float32 [kv_heads] scales when the storage holds bytes. False (nothing
    written) for inputs the kernel does not take."""
    if not (
        k.dtype == v.dtype
        and k.dtype in (torch.float32, torch.bfloat16)
        and _heads_contiguous(k)
        and _heads_contiguous(v)
        and slots.dtype == torch.int64
        and slots.is_contiguous()
    ):
        return False
    library().kv_write(
        k.data_ptr(),
        v.data_ptr(),
        int(k.dtype == torch.bfloat16),
        k.shape[0],
        k.shape[1],
        k.shape[2],
        k.stride(0),
        v.stride(0),
        slots.data_ptr(),
        storage.data_ptr(),
        KV_KINDS[storage.dtype],
        k_scale.data_ptr(),
        v_scale.data_ptr(),
        torch.get_num_threads(),
    )
    return True


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
        KV_KINDS[storage.dtype],
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
