"""The pool for a KV layout: per-head K/V pages for GQA, latent rows for MLA."""

from __future__ import annotations

import torch

from engine.kv.dsa_layout import DSALayout
from engine.kv.dsa_pool import DSALatentPool
from engine.kv.mla_pool import MLALatentPool
from engine.kv.pool import PagedKVPool
from engine.kv.sizing import KVLayout


def make_pool(
    layout: KVLayout,
    num_pages: int,
    page_size: int,
    kv_dtype: str,
    device: torch.device,
    per_head_scales: bool = False,
):
    """The pool that stores this layout: per-head K/V pages for GQA, latent rows for MLA.

    `per_head_scales` (GQA only: the MLA latent is shared by all heads)
    calibrates one scale per KV head instead of one per layer.
    """
    if layout.kind == "gqa":
        return PagedKVPool(
            layout, num_pages, page_size, kv_dtype, device, per_head_scales=per_head_scales
        )
    if isinstance(layout, DSALayout):  # MLA plus the sparse-attention indexer's keys
        return DSALatentPool(layout, num_pages, page_size, kv_dtype, device)
    if layout.kind == "mla":
        return MLALatentPool(layout, num_pages, page_size, kv_dtype, device)
    raise ValueError(f"no KV pool for layout kind {layout.kind!r}")
