"""The latent pool of MLA with DeepSeek sparse attention (DSA: DeepSeek V3.2, GLM-5.x).

Beside each token's MLA latent row, every layer that runs a lightning indexer
keeps that token's indexer key: one row of `index_head_dim` values (128 in the
released configs), rotated and normalised, that later queries score to pick
the positions they attend to. The keys sit in a second region of the same
pages, at the same slots, so the page allocator, the radix tree and the host
and disk tiers (which move a page's bytes, `page_regions`) carry both halves
of a cached prefix together. GLM-5's "shared" layers reuse another layer's
selection and keep no keys.

Indexer keys are not quantized to FP8, whatever the latent's dtype: the
indexer ranks positions, and a key rounded to e4m3 moves scores across the
top-k boundary. Measured on LayerNorm'd keys of width 128 with 32 heads over
4,096 positions, FP8 keys (one amax/448 scale) changed 23 of the 2,048 chosen
positions and 9 of 512, BF16 keys 2 and 1; the reference (transformers) keeps
them in the model's dtype. So an FP8 cache stores its indexer keys in BF16,
and a BF16 or float32 cache stores them as it stores the latent.
"""

from __future__ import annotations

import torch

from engine.kv.dsa_layout import DSALayout, index_key_dtype
from engine.kv.mla_pool import MLALatentPool
from engine.kv.pool_base import STORAGE_DTYPES, allocate_storage


class DSALatentPool(MLALatentPool):
    """The MLA latent pool plus the indexer keys of the layers that have an indexer."""

    def __init__(
        self,
        layout: DSALayout,
        num_pages: int,
        page_size: int,
        kv_dtype: str,
        device: torch.device | str = "cpu",
        scale_source: str = "calibrate",
    ):
        super().__init__(layout, num_pages, page_size, kv_dtype, device, scale_source)
        if layout.index_dim <= 0 or not layout.index_layers:
            raise ValueError("a DSA pool needs the indexer's key width and the layers keeping keys")
        # Model layer -> its row in the key region (shared-selection layers have none).
        self.index_row = {layer: row for row, layer in enumerate(layout.index_layers)}
        self.index_dtype = STORAGE_DTYPES[index_key_dtype(kv_dtype)]
        shape = (len(layout.index_layers), num_pages * page_size, layout.index_dim)
        # Slot 0 zero, like the latent: padded rows read it (allocate_storage).
        self.index_storage = allocate_storage(shape, self.index_dtype, self.device)

    def page_regions(self) -> tuple[torch.Tensor, ...]:
        return (self.storage, self.index_storage)

    def _row(self, layer: int) -> int:
        if layer not in self.index_row:
            raise KeyError(f"layer {layer} has no indexer, so it keeps no indexer keys")
        return self.index_row[layer]

    def write_index_keys(self, layer: int, keys: torch.Tensor, slots: torch.Tensor) -> None:
        """Store new tokens' indexer keys [T, index_dim] (rotated, normalised) at `slots`."""
        self.index_storage[self._row(layer)].index_copy_(0, slots, keys.to(self.index_dtype))

    def gather_index_keys(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """The indexer keys at `slots` (any shape) -> [*slots.shape, index_dim], as stored."""
        keys = self.index_storage[self._row(layer)].index_select(0, slots.reshape(-1))
        return keys.view(*slots.shape, self.layout.index_dim)
