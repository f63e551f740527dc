"""Reference attention over the paged cache, in torch; the CPU backend.

Every step writes the new tokens' K and V to the cache first and then reads
the whole context back from the cache, the new tokens included. In fp8 mode
attention therefore always sees the quantized values, so a prompt computes
the same function whether it was prefilled at once, in chunks, or found in
the prefix cache (DESIGN.md §3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata
from engine.kv.pool import PagedKVPool


class TorchAttentionBackend:
    name = "torch"

    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pool: PagedKVPool,
        meta: AttentionMetadata,
        softmax_scale: float,
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> attention output [T, Hq, Dv]."""
        pool.write(layer, k, v, meta.slot_mapping)
        if meta.decode_only:
            return self._decode(layer, q, pool, meta, softmax_scale)
        keys, values, k_factor, v_factor = pool.gather(layer, meta.context_slots, q.dtype)
        queries = q[meta.query_index]  # [B, Q, Hq, D]
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=meta.mask,
            is_causal=meta.is_causal_single,
            scale=softmax_scale * k_factor,
            enable_gqa=True,
        )  # [B, Hq, Q, Dv]
        if v_factor != 1.0:
            out = out * v_factor
        out = out.transpose(1, 2).flatten(0, 1)  # [B*Q, Hq, Dv]
        return out[meta.output_index]

    @staticmethod
    def _decode(layer, q, pool, meta: AttentionMetadata, softmax_scale: float) -> torch.Tensor:
        """One query per sequence: grouped matrix products in float32, no KV-head repeat.

        SDPA's CPU kernel is slow for a single query over a long context; two
        batched products over [B, kv_heads, group, L] are not.
        """
        batch = q.shape[0]
        keys, values, k_factor, v_factor = pool.gather(layer, meta.context_slots, torch.float32)
        kv_heads = keys.shape[2]
        queries = q.float().view(batch, kv_heads, -1, q.shape[-1])  # [B, Hkv, G, D]
        scores = torch.matmul(queries, keys.permute(0, 2, 3, 1))  # [B, Hkv, G, L]
        scores.mul_(softmax_scale * k_factor)
        if meta.key_padding is not None:
            scores.masked_fill_(meta.key_padding, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, values.transpose(1, 2))  # [B, Hkv, G, Dv]
        if v_factor != 1.0:
            out.mul_(v_factor)
        return out.view(batch, -1, values.shape[-1]).to(q.dtype)


def get_backend(name: str, deterministic: bool = False):
    from engine.errors import EngineError

    if name != "torch":
        raise EngineError(f"attention backend {name!r} is not available; available: torch")
    if deterministic:
        from engine.attention.deterministic import DeterministicAttentionBackend

        return DeterministicAttentionBackend()
    return TorchAttentionBackend()
