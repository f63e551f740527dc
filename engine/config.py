"""EngineConfig: every engine setting in one validated place."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DTypeName = Literal["auto", "bfloat16", "float32"]
KVDTypeName = Literal["auto", "bf16", "fp8_e4m3"]
# Default KV budget on CPU when none is given; GPUs size from free memory.
DEFAULT_CPU_KV_GIB = 1.0


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    dtype: DTypeName = "auto"
    kv_cache_dtype: KVDTypeName = "fp8_e4m3"
    attention_backend: str = "torch"
    kv_memory_gib: float | None = Field(default=None, gt=0)
    page_size: int = Field(default=16, ge=1, le=1024)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int = Field(default=2048, ge=16)
    max_model_len: int | None = Field(default=None, ge=2)
    kv_scales_file: str | None = None
    enable_prefix_caching: bool = True
    verify_prefix_cache: bool = False  # hash shared pages and check them on reuse
    max_waiting: int | None = Field(default=None, ge=1)  # beyond it: overloaded
    seed: int = 0
    # Batch-, chunk- and cache-invariant reductions: bit-identical outputs however
    # requests are batched, at a cost in speed (DESIGN.md §3).
    deterministic: bool = False
    device: str | None = None
