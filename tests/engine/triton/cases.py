"""Builders for kernel test cases: paged pools with cached prefixes, metadata, exact inputs.

Inputs that go through a KV write are drawn so the cache stores them exactly
(bf16 values for a bf16 cache; e4m3 values times power-of-two scales for an
fp8 cache). Then the torch and Triton backends store identical bytes even
under the interpreter, whose float->fp8 and float->bf16 casts round wrongly
(DESIGN.md §3), and the attention comparison measures attention alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata
from engine.kv.mla_pool import MLALatentPool, MLALayout
from engine.kv.pool import PagedKVPool
from engine.kv.quant import quantize_fp8
from engine.kv.sizing import KVLayout

LAYER = 1  # pools have two layers; tests use the second, so layer offsets matter


def e4m3_values(shape, device="cpu") -> torch.Tensor:
    """Random finite float8_e4m3fn values (every byte but the two NaNs), as float32."""
    raw = torch.randint(0, 256, shape, dtype=torch.int32).to(torch.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0
    return raw.view(torch.float8_e4m3fn).float().to(device)


def pow2_scales(n: int) -> torch.Tensor:
    """n positive power-of-two scales: x / scale is exact, so quantization is too."""
    return 2.0 ** torch.randint(-7, -2, (n,)).float()


def cache_exact(shape, pool, scale: float | torch.Tensor, device) -> torch.Tensor:
    """N(0, 1)-like values the pool stores without rounding: e4m3 values times a
    power-of-two scale (broadcast over the head dimension), or bf16 values."""
    if pool.is_fp8:
        scale = torch.as_tensor(scale, dtype=torch.float32)
        if scale.dim() == 1:
            scale = scale.view(-1, 1)
        return (quantize_fp8(torch.randn(shape), scale).float() * scale).to(device)
    return torch.randn(shape).bfloat16().float().to(device)


def page_tables(context_lens, page_size: int, num_pages: int) -> list[torch.Tensor]:
    """Each sequence's slots for positions 0..len-1 on pages drawn at random from the pool."""
    free = torch.randperm(num_pages).tolist()
    slots = []
    for length in context_lens:
        pages = torch.tensor([free.pop() for _ in range(-(-length // page_size))])
        positions = torch.arange(length)
        slots.append(pages[positions // page_size] * page_size + positions % page_size)
    return slots


def pages_needed(context_lens, page_size: int) -> int:
    return sum(-(-n // page_size) for n in context_lens) + 2  # spare pages stay unused


@dataclass
class GQACase:
    pools: tuple[PagedKVPool, PagedKVPool]  # identical: one per backend
    meta: AttentionMetadata
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float


def gqa_case(
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    query_lens: list[int],
    context_lens: list[int],
    kv_dtype: str,
    device,
    dtype: torch.dtype = torch.float32,
) -> GQACase:
    """Two identical pools whose sequences already hold their cached prefixes, and a step."""
    layout = KVLayout(num_layers=2, kind="gqa", num_kv_heads=kv_heads, head_dim=head_dim)
    num_pages = pages_needed(context_lens, page_size)
    pools = tuple(PagedKVPool(layout, num_pages, page_size, kv_dtype, device) for _ in range(2))
    k_scale, v_scale = pow2_scales(2), pow2_scales(2)
    for pool in pools:
        pool.storage.zero_()
        if pool.is_fp8:
            pool.set_scales(k_scale, v_scale, "test")
    slots = page_tables(context_lens, page_size, num_pages)
    for n, length, seq_slots in zip(query_lens, context_lens, slots, strict=True):
        if length > n:
            shape = (length - n, kv_heads, head_dim)
            k = cache_exact(shape, pools[0], k_scale[LAYER], device)
            v = cache_exact(shape, pools[0], v_scale[LAYER], device)
            for pool in pools:
                pool.write(LAYER, k, v, seq_slots[: length - n].to(device))
    new_slots = torch.cat(
        [s[length - n :] for s, n, length in zip(slots, query_lens, context_lens, strict=True)]
    )
    meta = AttentionMetadata.build(query_lens, context_lens, new_slots, slots, device)
    tokens = sum(query_lens)
    q = torch.randn(tokens, q_heads, head_dim).to(device, dtype)
    k = cache_exact((tokens, kv_heads, head_dim), pools[0], k_scale[LAYER], device).to(dtype)
    v = cache_exact((tokens, kv_heads, head_dim), pools[0], v_scale[LAYER], device).to(dtype)
    return GQACase(pools, meta, q, k, v, head_dim**-0.5)


def reference_attention(
    q: torch.Tensor,  # [n, Hq, D] float32 queries of one sequence
    keys: torch.Tensor,  # [L, Hkv, D] float32, true values
    values: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal GQA attention of the last n positions over L keys, in float64."""
    n, q_heads, _ = q.shape
    length, kv_heads, _ = keys.shape
    group = q_heads // kv_heads
    keys = keys.double().repeat_interleave(group, dim=1)
    values = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), keys) * scale
    # The mask lives where the scores do (CUDA on a GPU run; masked_fill_ wants one device).
    q_pos = torch.arange(length - n, length, device=scores.device)
    key_pos = torch.arange(length, device=scores.device)
    scores.masked_fill_(key_pos[None, :] > q_pos[:, None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(scores, dim=-1), values).float()


@dataclass
class MLACase:
    pools: tuple[MLALatentPool, MLALatentPool]
    meta: AttentionMetadata
    q_nope: torch.Tensor
    q_rope: torch.Tensor
    latent: torch.Tensor
    k_rope: torch.Tensor
    kv_b_weight: torch.Tensor


def mla_case(dims, page_size: int, context_lens: list[int], kv_dtype: str, device) -> MLACase:
    """Two identical latent pools holding each sequence's prefix, and one decode step."""
    r, rope = dims.lora_rank, dims.rope_dim
    layout = MLALayout(num_layers=2, kind="mla", latent_dim=r + rope, rope_dim=rope)
    num_pages = pages_needed(context_lens, page_size)
    pools = tuple(MLALatentPool(layout, num_pages, page_size, kv_dtype, device) for _ in range(2))
    latent_scale, rope_scale = pow2_scales(2), pow2_scales(2)
    for pool in pools:
        pool.storage.zero_()
        if pool.is_fp8:
            pool.set_scales(latent_scale, rope_scale, "test")
    slots = page_tables(context_lens, page_size, num_pages)
    batch = len(context_lens)
    prefix = torch.cat([s[:-1] for s in slots]).to(device)

    def rows(n):
        return (
            cache_exact((n, r), pools[0], latent_scale[LAYER], device),
            cache_exact((n, rope), pools[0], rope_scale[LAYER], device) * 4,
        )

    old_latent, old_rope = rows(prefix.numel())
    for pool in pools:
        pool.write(LAYER, old_latent, old_rope, prefix)
    last = torch.stack([s[-1] for s in slots])
    meta = AttentionMetadata.build([1] * batch, context_lens, last, slots, device)
    latent, k_rope = rows(batch)
    h = dims.num_heads
    return MLACase(
        pools,
        meta,
        torch.randn(batch, h, dims.nope_dim, device=device),
        torch.randn(batch, h, rope, device=device),
        latent,
        k_rope,
        torch.randn(h * (dims.nope_dim + dims.v_dim), r, device=device) * r**-0.5,
    )


def written_rows(pool, layer: int, slots: torch.Tensor) -> torch.Tensor:
    """The stored bytes at `slots`, comparable with torch.equal for any storage dtype."""
    rows = pool.storage[layer][slots]
    return rows.view(torch.uint8) if rows.element_size() == 1 else rows.view(torch.int16)


def torch_and_triton(case, fp8_dot: bool | None = False):
    """The same step through the torch backend (pool 0) and the Triton one (pool 1): (out, ref).

    FP8 decode widens the stored bytes as torch does (fp8_dot False), so the two
    differ only in summation order; test_decode_fp8_dot.py bounds the e4m3 dots."""
    from engine.attention.torch_backend import TorchAttentionBackend
    from engine.attention.triton.backend import TritonAttentionBackend

    args = (LAYER, case.q, case.k, case.v)
    ref = TorchAttentionBackend().forward(*args, case.pools[0], case.meta, case.scale)
    triton_backend = TritonAttentionBackend()
    triton_backend.fp8_dot = fp8_dot
    out = triton_backend.forward(*args, case.pools[1], case.meta, case.scale)
    return out, ref
