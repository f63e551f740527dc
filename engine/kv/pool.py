"""The paged KV pool for grouped-query attention: storage, scales, write and gather.

Layout: per layer a [num_slots, 2, kv_heads, head_dim] tensor (K and V side by
side, so one index_copy writes and one index_select reads both) where
slot = page * page_size + offset. In fp8 mode the bytes are float8_e4m3fn with
a float32 scale per layer for K and for V (DESIGN.md §3): from the checkpoint
when it has them, else calibrated on the first write and then frozen, else 1.0.
"""

from __future__ import annotations

import logging

import torch

from engine.kv.pool_base import PagedPoolBase
from engine.kv.quant import (
    HALF_TRICK_FACTOR,
    calibrate_scale,
    fp8_bits_to_half,
    quantize_fp8,
)
from engine.kv.sizing import KVLayout

log = logging.getLogger(__name__)


class PagedKVPool(PagedPoolBase):
    layout_kind = "gqa"

    def __init__(
        self,
        layout: KVLayout,
        num_pages: int,
        page_size: int,
        kv_dtype: str,
        device: torch.device | str = "cpu",
        scale_source: str = "calibrate",
    ):
        super().__init__(layout, num_pages, page_size, kv_dtype, device)
        num_slots = num_pages * page_size
        shape = (layout.num_layers, num_slots, 2, layout.num_kv_heads, layout.head_dim)
        self.storage = torch.empty(shape, dtype=self.storage_dtype, device=self.device)
        self.k_scale = torch.ones(layout.num_layers, dtype=torch.float32)
        self.v_scale = torch.ones(layout.num_layers, dtype=torch.float32)
        self.scale_source = scale_source if self.is_fp8 else "none"
        self._calibrated = [scale_source != "calibrate"] * layout.num_layers
        self._scale_cache: dict[int, torch.Tensor] = {}

    def set_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor, source: str) -> None:
        """Use fixed per-layer scales (from a checkpoint or a scales file)."""
        self.k_scale, self.v_scale = self.checked_scales(k_scale, v_scale, "K and V")
        self.scale_source = source
        self._calibrated = [True] * self.layout.num_layers
        self._scale_cache = {}

    def scales(self) -> dict[str, list[float]]:
        return {"k": self.k_scale.tolist(), "v": self.v_scale.tolist()}

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store new tokens' K and V ([T, kv_heads, head_dim]) at their slots."""
        kv = torch.stack((k, v), dim=1)  # [T, 2, kv_heads, head_dim]
        if self.is_fp8:
            if not self._calibrated[layer]:
                self.k_scale[layer] = calibrate_scale(k)
                self.v_scale[layer] = calibrate_scale(v)
                self._calibrated[layer] = True
                self._scale_cache.pop(layer, None)
            kv = quantize_fp8(kv, self._scales(layer)).view(torch.uint8)
        else:
            kv = kv.to(self.storage.dtype)
        self.storage[layer].index_copy_(0, slots, kv)

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V scales of a layer as float32 [kv_heads] tensors on the pool's device.

        The form GPU kernels take; per-tensor scales are repeated per head.
        """
        heads = self.layout.num_kv_heads
        k = (
            self.k_scale[layer].reshape(-1).expand(heads)
            if self.k_scale[layer].numel() == 1
            else self.k_scale[layer]
        )
        v = (
            self.v_scale[layer].reshape(-1).expand(heads)
            if self.v_scale[layer].numel() == 1
            else self.v_scale[layer]
        )
        return k.contiguous().to(self.device), v.contiguous().to(self.device)

    def _scales(self, layer: int) -> torch.Tensor:
        """[2, 1, 1] K and V scales of a layer, broadcastable over [T, 2, heads, dim]."""
        cached = self._scale_cache.get(layer)
        if cached is None:
            values = torch.stack((self.k_scale[layer], self.v_scale[layer])).view(2, 1, 1)
            cached = self._scale_cache[layer] = values.to(self.device)
        return cached

    def gather(
        self, layer: int, slots: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, float, float]:
        """K and V at `slots` (any shape) in `dtype`, plus the factors that dequantize them.

        The true values are `k * k_factor` and `v * v_factor`; attention folds
        the factors into its softmax scale and its output instead of spending a
        pass over K and V.
        """
        kv = self.storage[layer].index_select(0, slots.reshape(-1))
        if self.is_fp8:
            kv = fp8_bits_to_half(kv).to(dtype)
            k_factor = float(self.k_scale[layer]) * HALF_TRICK_FACTOR
            v_factor = float(self.v_scale[layer]) * HALF_TRICK_FACTOR
        else:
            kv = kv.to(dtype)
            k_factor = v_factor = 1.0
        kv = kv.view(*slots.shape, 2, self.layout.num_kv_heads, self.layout.head_dim)
        return kv.select(-3, 0), kv.select(-3, 1), k_factor, v_factor
