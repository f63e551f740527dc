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

from engine.kv.quant import (
    FP8_DTYPE,
    HALF_TRICK_FACTOR,
    calibrate_scale,
    fp8_bits_to_half,
    quantize_fp8,
)
from engine.kv.sizing import KVLayout

log = logging.getLogger(__name__)

STORAGE_DTYPES = {"bf16": torch.bfloat16, "float32": torch.float32, "fp8_e4m3": FP8_DTYPE}


class PagedKVPool:
    def __init__(
        self,
        layout: KVLayout,
        num_pages: int,
        page_size: int,
        kv_dtype: str,
        device: torch.device | str = "cpu",
        scale_source: str = "calibrate",
    ):
        if layout.kind != "gqa":
            raise ValueError("PagedKVPool stores GQA heads; MLA needs the latent pool")
        if kv_dtype not in STORAGE_DTYPES:
            raise ValueError(f"kv dtype {kv_dtype!r}: use one of {sorted(STORAGE_DTYPES)}")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        self.is_fp8 = kv_dtype == "fp8_e4m3"
        self.device = torch.device(device)
        num_slots = num_pages * page_size
        shape = (layout.num_layers, num_slots, 2, layout.num_kv_heads, layout.head_dim)
        # uint8 storage for fp8: index_copy_ and index_select are not defined for
        # float8 on every torch build, and the bytes are the same.
        storage_dtype = torch.uint8 if self.is_fp8 else STORAGE_DTYPES[kv_dtype]
        self.storage = torch.empty(shape, dtype=storage_dtype, device=self.device)
        self.k_scale = torch.ones(layout.num_layers, dtype=torch.float32)
        self.v_scale = torch.ones(layout.num_layers, dtype=torch.float32)
        self.scale_source = scale_source if self.is_fp8 else "none"
        self._calibrated = [scale_source != "calibrate"] * layout.num_layers
        self._scale_cache: dict[int, torch.Tensor] = {}

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def set_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor, source: str) -> None:
        """Use fixed per-layer scales (from a checkpoint or a scales file)."""
        n = self.layout.num_layers
        if k_scale.numel() != n or v_scale.numel() != n:
            raise ValueError(
                f"expected {n} K and V scales, got {k_scale.numel()}/{v_scale.numel()}"
            )
        if bool((k_scale <= 0).any() or (v_scale <= 0).any()):
            raise ValueError("KV scales must be positive")
        self.k_scale = k_scale.float().flatten().clone()
        self.v_scale = v_scale.float().flatten().clone()
        self.scale_source = source
        self._calibrated = [True] * n
        self._scale_cache = {}

    def page_bytes(self, page: int) -> bytes:
        """The stored bytes of one page across all layers (prefix-cache verification)."""
        start = page * self.page_size
        rows = self.storage[:, start : start + self.page_size].contiguous()
        raw = rows.view(torch.uint8) if rows.element_size() == 1 else rows.view(torch.int16)
        return raw.cpu().numpy().tobytes()

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
