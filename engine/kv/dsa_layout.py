"""What a token costs in the cache of an MLA model with DeepSeek sparse attention (DSA).

Torch-free, like engine/kv/sizing.py, so the planner reads it without loading
torch. The pool that stores this layout is engine/kv/dsa_pool.py, whose
docstring says why indexer keys are never FP8.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv.dtypes import FP8_KV_DTYPE, KV_DTYPE_BYTES
from engine.kv.sizing import KVLayout


def index_key_dtype(kv_dtype: str) -> str:
    """The dtype indexer keys are stored in for a cache of `kv_dtype`: BF16 for an FP8
    cache (its top-k would move: engine/kv/dsa_pool.py), else the cache's own."""
    return "bf16" if kv_dtype == FP8_KV_DTYPE else kv_dtype


@dataclass(frozen=True)
class DSALayout(KVLayout):
    """An MLA layout (kind "mla": one latent row per token and layer, its last `rope_dim`
    values the rope key) whose layers in `index_layers` also keep an indexer key of
    `index_dim` values per token."""

    rope_dim: int = 0
    index_dim: int = 0
    index_layers: tuple[int, ...] = ()

    @property
    def lora_rank(self) -> int:
        return self.latent_dim - self.rope_dim

    @property
    def index_values_per_token(self) -> int:
        return len(self.index_layers) * self.index_dim

    def bytes_per_token(self, kv_dtype: str) -> int:
        key_bytes = KV_DTYPE_BYTES[index_key_dtype(kv_dtype)]
        return super().bytes_per_token(kv_dtype) + self.index_values_per_token * key_bytes
