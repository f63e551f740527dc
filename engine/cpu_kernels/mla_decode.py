"""Absorbed MLA decode over the latent pool in one C call (mla_decode.c)."""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import library, unavailable
from engine.cpu_kernels.paged_decode import KV_KINDS

ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)


def _rows_contiguous(x: torch.Tensor) -> bool:
    """[B, H, D] with each head's D values contiguous (q's nope and rope halves are views)."""
    return x.dim() == 3 and x.stride(2) == 1


def supports(
    q_nope: torch.Tensor, q_rope: torch.Tensor, kv_b_weight: torch.Tensor, storage: torch.Tensor
) -> bool:
    """Whether the kernel takes these queries, kv_b_proj weight and layer storage
    [slots, lora_rank + rope_dim]: all on the CPU, the activations and the weight in one
    of bf16 and float32, the storage float32, bf16 or FP8 bytes, and the kernels built."""
    return (
        all(t.device.type == "cpu" for t in (q_nope, q_rope, kv_b_weight, storage))
        and q_nope.dtype in ACTIVATION_DTYPES
        and q_rope.dtype == q_nope.dtype
        and kv_b_weight.dtype == q_nope.dtype
        and _rows_contiguous(q_nope)
        and _rows_contiguous(q_rope)
        and kv_b_weight.is_contiguous()
        and storage.dim() == 2
        and storage.dtype in KV_KINDS
        and storage.is_contiguous()
        and not unavailable()
    )


def mla_decode(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_b_weight: torch.Tensor,
    storage: torch.Tensor,
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    latent_factor: float,
    rope_factor: float,
    softmax_scale: float,
) -> torch.Tensor:
    """One query per sequence -> out [B, H, v_dim] in q's dtype.

    q_nope [B, H, nope], q_rope [B, H, rope] (rotated); kv_b_weight [H * (nope + v),
    lora_rank], per head nope rows of W_UK then v rows of W_UV; storage: one layer's
    latent rows [slots, lora_rank + rope]; context_slots [B, L] int64, row b valid up to
    context_lens[b] (int64 [B]). The true latent and rope key are the stored values
    (FP8 bytes read as value * 2**-8) times latent_factor and rope_factor.
    """
    if not supports(q_nope, q_rope, kv_b_weight, storage):
        raise ValueError("mla_decode takes CPU bf16 or float32 queries and weight (see supports)")
    batch, heads, nope = q_nope.shape
    rope = q_rope.shape[2]
    lora_rank = storage.shape[1] - rope
    head_rows = kv_b_weight.shape[0] // heads if heads else 0
    v_dim = head_rows - nope
    if (
        q_rope.shape[:2] != (batch, heads)
        or lora_rank <= 0
        or v_dim <= 0
        or kv_b_weight.shape != (heads * head_rows, lora_rank)
    ):
        raise ValueError(
            f"mla_decode: q_nope {tuple(q_nope.shape)}, q_rope {tuple(q_rope.shape)}, kv_b "
            f"{tuple(kv_b_weight.shape)} and rows {tuple(storage.shape)} do not fit together"
        )
    if (
        context_slots.dtype != torch.int64
        or context_lens.dtype != torch.int64
        or not context_slots.is_contiguous()
        or not context_lens.is_contiguous()
        or context_slots.dim() != 2
        or context_slots.shape[0] != batch
        or context_lens.shape != (batch,)
    ):
        raise ValueError("mla_decode: context_slots [B, L] and context_lens [B], contiguous int64")
    out = torch.empty(batch, heads, v_dim, dtype=q_nope.dtype)
    status = library().mla_decode(
        q_nope.data_ptr(),
        q_rope.data_ptr(),
        q_nope.stride(0),
        q_nope.stride(1),
        q_rope.stride(0),
        q_rope.stride(1),
        int(q_nope.dtype == torch.bfloat16),
        kv_b_weight.data_ptr(),
        storage.data_ptr(),
        KV_KINDS[storage.dtype],
        context_slots.data_ptr(),
        context_lens.data_ptr(),
        batch,
        context_slots.shape[1],
        heads,
        nope,
        rope,
        v_dim,
        lora_rank,
        float(latent_factor),
        float(rope_factor),
        float(softmax_scale),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("mla_decode could not allocate its scratch buffers")
    return out
