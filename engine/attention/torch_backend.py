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
        self.write(layer, k, v, pool, meta)
        if meta.decode_only:
            return self._decode(layer, q, pool, meta, softmax_scale)
        keys, values, k_factor, v_factor = pool.gather(layer, meta.context_slots, q.dtype)
        queries = q[meta.query_index]  # [B, Q, Hq, D]
        if isinstance(k_factor, torch.Tensor):
            # Per-KV-head scales: each query head takes its KV head's factor.
            per_head = self.per_query_head(k_factor, q.shape[1])
            queries = (queries.float() * per_head.view(-1, 1)).to(q.dtype)
            k_factor = 1.0
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=meta.mask,
            is_causal=meta.is_causal_single,
            scale=softmax_scale * k_factor,
            enable_gqa=True,
        )  # [B, Hq, Q, Dv]
        if isinstance(v_factor, torch.Tensor):
            out = out * self.per_query_head(v_factor, q.shape[1]).view(-1, 1, 1).to(out.dtype)
        elif v_factor != 1.0:
            out = out * v_factor
        out = out.transpose(1, 2).flatten(0, 1)  # [B*Q, Hq, Dv]
        return out[meta.output_index]

    def write(self, layer, k, v, pool, meta: AttentionMetadata) -> None:
        pool.write(layer, k, v, meta.slot_mapping)

    @staticmethod
    def per_query_head(factor: torch.Tensor, num_heads: int) -> torch.Tensor:
        """A per-KV-head factor [kv_heads] repeated for the query heads of each group."""
        return factor.repeat_interleave(num_heads // factor.numel())

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
        if isinstance(k_factor, torch.Tensor):  # per-KV-head scales, onto the queries
            queries = queries * k_factor.view(1, kv_heads, 1, 1)
            k_factor = 1.0
        scores = torch.matmul(queries, keys.permute(0, 2, 3, 1))  # [B, Hkv, G, L]
        scores.mul_(softmax_scale * k_factor)
        if meta.key_padding is not None:
            scores.masked_fill_(meta.key_padding, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, values.transpose(1, 2))  # [B, Hkv, G, Dv]
        if isinstance(v_factor, torch.Tensor):
            out.mul_(v_factor.view(1, kv_heads, 1, 1))
        elif v_factor != 1.0:
            out.mul_(v_factor)
        return out.view(batch, -1, values.shape[-1]).to(q.dtype)
