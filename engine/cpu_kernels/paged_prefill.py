"""Prefill attention that reads the paged GQA cache in place (paged_prefill.c)."""

from __future__ import annotations

import torch

from engine.cpu_kernels.library import bf16_dot_products, library
from engine.cpu_kernels.paged_decode import KV_KINDS, MAX_HEAD_DIM


def prefill_supports(q: torch.Tensor, storage: torch.Tensor) -> bool:
    """BF16 queries over a BF16 or FP8 layer storage [slots, 2, kv_heads, head_dim] on a
    CPU with AVX-512 BF16, or in the AVX2 build. Float32 queries stay on the torch path,
    which keeps them exact."""
    head_dim = q.shape[-1]
    return (
        bf16_dot_products()
        and q.device.type == "cpu"
        and q.dtype == torch.bfloat16
        and storage.device.type == "cpu"
        and storage.dtype in KV_KINDS
        and storage.dtype != torch.float32
        and storage.is_contiguous()
        and head_dim % 16 == 0
        and head_dim <= MAX_HEAD_DIM
        and q.shape[1] % storage.shape[2] == 0
    )


def paged_prefill(
    q: torch.Tensor,
    storage: torch.Tensor,
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    query_lens: list[int],
    k_factor: torch.Tensor,
    v_factor: torch.Tensor,
    softmax_scale: float,
) -> torch.Tensor:
    """q [T, Hq, D] BF16, the queries of each sequence in turn (query_lens[b] rows, the
    last positions of its context) -> out [T, Hq, D] BF16, causal over the context.

    storage, context_slots [B, L] and context_lens [B] as for paged_decode; k_factor and
    v_factor float32 [Hkv] carry the FP8 scales.
    """
    q = q.contiguous()
    out = torch.empty_like(q)
    lens = torch.tensor(query_lens, dtype=torch.int64)
    starts = torch.zeros_like(lens)
    starts[1:] = lens.cumsum(0)[:-1]
    status = library().paged_prefill(
        q.data_ptr(),
        storage.data_ptr(),
        KV_KINDS[storage.dtype],
        context_slots.data_ptr(),
        context_lens.data_ptr(),
        starts.data_ptr(),
        lens.data_ptr(),
        len(query_lens),
        context_slots.shape[1],
        q.shape[1],
        storage.shape[2],
        q.shape[2],
        k_factor.data_ptr(),
        v_factor.data_ptr(),
        float(softmax_scale),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status == -2:
        raise RuntimeError("paged_prefill needs a CPU with AVX-512 BF16")
    if status != 0:
        raise MemoryError("paged_prefill could not allocate its scratch buffers")
    return out
