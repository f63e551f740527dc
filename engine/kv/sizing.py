"""KV bytes per token and pool capacity: one formula for the engine and the planner."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.kv.dtypes import KV_DTYPE_BYTES  # the KV dtypes and their bytes, declared once

__all__ = ["KV_DTYPE_BYTES", "KVLayout", "capacity_tokens", "kv_bytes_per_token"]


@dataclass(frozen=True)
class KVLayout:
    """What one token costs in the cache for one model.

    GQA stores K and V for every KV head; MLA stores one latent row per token
    (kv_lora_rank + rope dims) that serves as both K and V.
    """

    num_layers: int
    kind: str  # "gqa" or "mla"
    num_kv_heads: int = 0
    head_dim: int = 0
    latent_dim: int = 0  # MLA: kv_lora_rank + qk_rope_head_dim

    def for_rank(self, tp: int) -> KVLayout:
        """What one tensor-parallel rank's pool holds: its share of the GQA heads
        (one replicated head when there are fewer heads than ranks); MLA's latent
        is replicated, so every rank holds all of it."""
        if self.kind == "mla" or tp == 1:
            return self
        return replace(self, num_kv_heads=max(1, -(-self.num_kv_heads // tp)))

    @property
    def values_per_token(self) -> int:
        if self.kind == "mla":
            return self.num_layers * self.latent_dim
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def bytes_per_token(self, kv_dtype: str) -> int:
        """What one token costs in a cache of `kv_dtype`: every value in that dtype, unless
        a layout keeps a part in another (DSA's indexer keys: engine/kv/dsa_pool.py)."""
        return self.values_per_token * KV_DTYPE_BYTES[kv_dtype]


def kv_bytes_per_token(layout: KVLayout, kv_dtype: str, tp: int = 1) -> int:
    """Bytes one token occupies on one GPU (GQA heads split across TP ranks; MLA replicates)."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; use one of {sorted(KV_DTYPE_BYTES)}")
    return layout.for_rank(tp).bytes_per_token(kv_dtype)


def capacity_tokens(
    budget_bytes: int, layout: KVLayout, kv_dtype: str, page_size: int, tp: int = 1
) -> int:
    """Whole pages that fit the budget, in tokens.

    `budget_bytes` is one GPU's KV budget; with tensor parallelism every rank holds
    its share of the same tokens, so one rank's budget is the replica's capacity.
    """
    per_token = kv_bytes_per_token(layout, kv_dtype, tp)
    pages = max(0, int(budget_bytes)) // (per_token * page_size)
    return int(pages) * page_size
