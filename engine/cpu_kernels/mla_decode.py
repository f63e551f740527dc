"""Absorbed MLA decode over the latent pool in one C call (mla_decode.c)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.cpu_kernels.grid_matmul import TILE, GridFormat
from engine.cpu_kernels.library import library, unavailable
from engine.cpu_kernels.paged_decode import KV_KINDS

ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)


class GridLike(Protocol):
    """A grid weight (engine/layers/cpu_grid_weights.py's GridWeight): `rows` rows of
    codes and scales in the int8 kernel's layout, in `format`."""

    codes: torch.Tensor
    scales: torch.Tensor
    format: GridFormat
    rows: int


@dataclass
class LatentGrid:
    """W_UK and W_UV as grid weights, the way a GGUF file holds them: k_b [H * r rows of
    nope] (attn_k_b, W_UK[h]^T per head) and v_b [H * v rows of r] (attn_v_b). The cache
    holds the latent as s = H (c / gain) when the KV rotation is on (gain [r] float32 and
    the Hadamard block set by the model), c itself when it is off (gain None, block 0)."""

    k_b: GridLike
    v_b: GridLike
    gain: torch.Tensor | None = None
    block: int = 0

    @property
    def nbytes(self) -> int:
        tensors = (self.k_b.codes, self.k_b.scales, self.v_b.codes, self.v_b.scales)
        return sum(t.numel() * t.element_size() for t in tensors)

    def fits(self, heads: int, nope: int, v_dim: int, lora_rank: int) -> bool:
        """Whether the kernel takes these weights for this attention's shapes: each head's
        rows whole tiles, each row whole blocks of its format, the rotation's block one
        the kernel transforms."""
        block_ok = self.block == 0 or (
            16 <= self.block <= 1024
            and self.block & (self.block - 1) == 0
            and lora_rank % self.block == 0
        )
        return (
            lora_rank % TILE == 0
            and v_dim % TILE == 0
            and nope % self.k_b.format.block == 0
            and lora_rank % self.v_b.format.block == 0
            and (self.gain is None or self.gain.shape == (lora_rank,))
            and block_ok
            and self.k_b.rows == heads * lora_rank
            and self.v_b.rows == heads * v_dim
        )


def _rows_contiguous(x: torch.Tensor) -> bool:
    """[B, H, D] with each head's D values contiguous (q's nope and rope halves are views)."""
    return x.dim() == 3 and x.stride(2) == 1


def supports(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    kv_b_weight: torch.Tensor | None,
    storage: torch.Tensor,
) -> bool:
    """Whether the kernel takes these queries, kv_b_proj weight (None: grid weights, which
    LatentGrid.fits judges) and layer storage [slots, lora_rank + rope_dim]: all on the
    CPU, the activations and the weight in one of bf16 and float32, the storage float32,
    bf16 or FP8 bytes, and the kernels built."""
    dense_ok = kv_b_weight is None or (
        kv_b_weight.device.type == "cpu"
        and kv_b_weight.dtype == q_nope.dtype
        and kv_b_weight.is_contiguous()
    )
    return (
        all(t.device.type == "cpu" for t in (q_nope, q_rope, storage))
        and dense_ok
        and q_nope.dtype in ACTIVATION_DTYPES
        and q_rope.dtype == q_nope.dtype
        and _rows_contiguous(q_nope)
        and _rows_contiguous(q_rope)
        and storage.dim() == 2
        and storage.dtype in KV_KINDS
        and storage.is_contiguous()
        and not unavailable()
    )


def _query_args(q_nope: torch.Tensor, q_rope: torch.Tensor) -> tuple:
    """The queries as both C entries take them: pointers, strides (b, h), bf16 or not."""
    return (
        q_nope.data_ptr(),
        q_rope.data_ptr(),
        q_nope.stride(0),
        q_nope.stride(1),
        q_rope.stride(0),
        q_rope.stride(1),
        int(q_nope.dtype == torch.bfloat16),
    )


def _rows_and_shapes(storage, context_slots, context_lens, shape: tuple) -> tuple:
    """The layer's rows and the contexts, then B, L, H, nope, rope, v, r, as both C entries
    take them; shape: (B, H, nope, rope, v, r)."""
    batch, heads, nope, rope, v_dim, lora_rank = shape
    return (
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
    )


def _check_context(context_slots: torch.Tensor, context_lens: torch.Tensor, batch: int) -> None:
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
    _check_context(context_slots, context_lens, batch)
    out = torch.empty(batch, heads, v_dim, dtype=q_nope.dtype)
    status = library().mla_decode(
        *_query_args(q_nope, q_rope),
        kv_b_weight.data_ptr(),
        *_rows_and_shapes(
            storage, context_slots, context_lens, (batch, heads, nope, rope, v_dim, lora_rank)
        ),
        *(float(latent_factor), float(rope_factor), float(softmax_scale)),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError("mla_decode could not allocate its scratch buffers")
    return out


def mla_decode_grid(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    grid: LatentGrid,
    storage: torch.Tensor,
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    latent_factor: float,
    rope_factor: float,
    softmax_scale: float,
) -> torch.Tensor:
    """mla_decode with W_UK and W_UV from grid weights (LatentGrid); the same arguments
    otherwise, q in bf16 or float32. The queries' nope part and the attention's latent
    output are quantized to int8 per group of 32 for the products, as every grid product
    quantizes its activations."""
    batch, heads, nope = q_nope.shape
    rope = q_rope.shape[2]
    lora_rank = storage.shape[1] - rope
    v_dim = grid.v_b.rows // heads if heads else 0
    if not (
        q_nope.device.type == "cpu"
        and q_nope.dtype in ACTIVATION_DTYPES
        and q_rope.dtype == q_nope.dtype
        and _rows_contiguous(q_nope)
        and _rows_contiguous(q_rope)
        and q_rope.shape[:2] == (batch, heads)
        and storage.dim() == 2
        and storage.dtype in KV_KINDS
        and storage.is_contiguous()
        and lora_rank > 0
        and grid.fits(heads, nope, v_dim, lora_rank)
        and not unavailable()
    ):
        raise ValueError("mla_decode_grid: these queries, weights or rows do not fit the kernel")
    _check_context(context_slots, context_lens, batch)
    gain = None if grid.gain is None else grid.gain.float().contiguous()
    out = torch.empty(batch, heads, v_dim, dtype=q_nope.dtype)
    status = library().mla_decode_grid(
        *_query_args(q_nope, q_rope),
        grid.k_b.codes.data_ptr(),
        grid.k_b.scales.data_ptr(),
        int(grid.k_b.format),
        grid.v_b.codes.data_ptr(),
        grid.v_b.scales.data_ptr(),
        int(grid.v_b.format),
        None if gain is None else gain.data_ptr(),
        grid.block,
        *_rows_and_shapes(
            storage, context_slots, context_lens, (batch, heads, nope, rope, v_dim, lora_rank)
        ),
        *(float(latent_factor), float(rope_factor), float(softmax_scale)),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError("mla_decode_grid could not allocate its scratch buffers")
    if status != 0:
        raise ValueError("mla_decode_grid: a shape or format the grid products do not take")
    return out
