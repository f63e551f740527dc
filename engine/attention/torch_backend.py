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


def get_backend(name: str, deterministic: bool = False):
    from engine.errors import EngineError

    if name != "torch":
        raise EngineError(f"attention backend {name!r} is not available; available: torch")
    if deterministic:
        from engine.attention.deterministic import DeterministicAttentionBackend

        return DeterministicAttentionBackend()
    return TorchAttentionBackend()
