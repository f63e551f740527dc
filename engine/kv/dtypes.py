"""The KV cache's storage dtypes, declared once: the names `kv_cache_dtype` takes
(besides "auto"), the bytes each stores per value, and the one "auto" picks.

EngineConfig derives the setting's choices from here, engine/kv/sizing.py what a
token costs and engine/kv/pool_base.py each name's torch storage dtype; the
dtype a model's cache takes is decided here too (`resolve_kv_dtype`). It is
torch-free, as is the engine/kv package file, so that the config and
`resident serve --help` read it without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The FP8 cache: values quantized with per-layer (or per-head) scales, which
# `resident models calibrate` measures.
FP8_KV_DTYPE = "fp8_e4m3"

# Bytes per stored value, by the name `kv_cache_dtype` takes.
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, FP8_KV_DTYPE: 1, "float32": 4}
KV_DTYPES: tuple[str, ...] = tuple(KV_DTYPE_BYTES)
# What the planner, the kernel check and the throughput bench set side by side:
# the serving dtypes (float32 is for reference runs on CPU).
SERVING_KV_DTYPES: tuple[str, ...] = ("bf16", FP8_KV_DTYPE)

# `kv_cache_dtype="auto"` keeps what the model computes in: its dtype's name (the
# `dtype` setting, resolved) -> the cache's. A float32 model keeps a float32 cache.
AUTO_KV_DTYPES: dict[str, str] = {"bfloat16": "bf16", "float32": "float32"}

assert set(AUTO_KV_DTYPES.values()) <= set(KV_DTYPES), "auto must pick a declared KV dtype"


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> str:
    """The KV storage dtype `kv_cache_dtype` names; "auto" keeps the model's dtype
    (AUTO_KV_DTYPES: a float32 model keeps a float32 cache)."""
    if name == "auto":
        return AUTO_KV_DTYPES[str(model_dtype).removeprefix("torch.")]
    return name
