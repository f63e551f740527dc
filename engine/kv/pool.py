"""The paged KV pool for grouped-query attention: storage, scales, write and gather.

Layout: per layer a [num_slots, 2, kv_heads, head_dim] tensor (K and V side by
side, so one index_copy writes and one index_select reads both) where
slot = page * page_size + offset. In fp8 mode the bytes are float8_e4m3fn with
float32 scales for K and for V (DESIGN.md §3), per layer or, with
`per_head_scales`, per layer and KV head: from the checkpoint or a scales file
when given (`set_scales`), else calibrated on the first write of each layer
(amax / 448 with headroom) and then frozen, else 1.0. `observe` collects the
maxima of everything written, for calibrating over a prompt set.
"""

from __future__ import annotations

import logging

import torch

from engine.kv.pool_base import PagedPoolBase, allocate_storage, warn_if_short_calibration
from engine.kv.quant import (
    HALF_TRICK_FACTOR,
    calibrate_scale,
    fp8_bits_to_half,
    observed_amax,
    quantize_fp8,
    scale_from_amax,
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
        per_head_scales: bool = False,
    ):
        super().__init__(layout, num_pages, page_size, kv_dtype, device)
        num_slots = num_pages * page_size
        shape = (layout.num_layers, num_slots, 2, layout.num_kv_heads, layout.head_dim)
        self.storage = allocate_storage(shape, self.storage_dtype, self.device)
        self.per_head = bool(per_head_scales)
        scale_shape = (
            (layout.num_layers, layout.num_kv_heads) if self.per_head else layout.num_layers
        )
        self.k_scale = torch.ones(scale_shape, dtype=torch.float32)
        self.v_scale = torch.ones(scale_shape, dtype=torch.float32)
        self.scale_source = scale_source if self.is_fp8 else "none"
        self._calibrated = [scale_source != "calibrate"] * layout.num_layers
        self._observed: tuple[torch.Tensor, torch.Tensor] | None = None
        self._forget_cached_scales()

    # ----- scales -------------------------------------------------------------
    def set_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor, source: str) -> None:
        """Use fixed scales (checkpoint, scales file, calibration): [layers] or [layers, kv_heads]."""
        self.k_scale, self.v_scale = self.checked_scales(
            k_scale, v_scale, "K and V", heads=self.layout.num_kv_heads
        )
        self.per_head = self.k_scale.dim() == 2
        self.scale_source = source
        self._calibrated = [True] * self.layout.num_layers
        self._forget_cached_scales()

    @property
    def granularity(self) -> str:
        return "per_head" if self.per_head else "per_layer"

    @property
    def calibrated_layers(self) -> int:
        return sum(self._calibrated)

    def scales(self) -> dict[str, list]:
        """Per layer a float, or a list of one float per KV head."""
        return {"k": self.k_scale.tolist(), "v": self.v_scale.tolist()}

    def observe(self, enabled: bool = True) -> None:
        """Start (or stop) recording the |max| of the K and V written, at the pool's granularity."""
        if enabled:
            self._observed = (torch.zeros_like(self.k_scale), torch.zeros_like(self.v_scale))
        else:
            self._observed = None

    def observed_scales(self, margin: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Scales from what `observe` recorded (amax / 448 with the calibration margin)."""
        if self._observed is None:
            raise RuntimeError("observe() was not started")
        kwargs = {} if margin is None else {"margin": margin}
        return tuple(scale_from_amax(amax, **kwargs) for amax in self._observed)

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

    def _forget_cached_scales(self) -> None:
        self._scale_cache: dict[int, torch.Tensor] = {}
        self._factor_cache: dict[tuple[str, int], tuple] = {}
        # Bumped whenever a scale changes: holders of cached scale tensors rebuild.
        self.scales_version = getattr(self, "scales_version", -1) + 1

    def _cached(self, kind: str, layer: int, build) -> tuple:
        key = (kind, layer)
        if key not in self._factor_cache:
            self._factor_cache[key] = build()
        return self._factor_cache[key]

    def _calibrate(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.per_head:
            self.k_scale[layer] = scale_from_amax(observed_amax(k, per_head=True))
            self.v_scale[layer] = scale_from_amax(observed_amax(v, per_head=True))
        else:
            self.k_scale[layer] = calibrate_scale(k)
            self.v_scale[layer] = calibrate_scale(v)
        self._calibrated[layer] = True
        self._scale_cache.pop(layer, None)
        self._factor_cache = {k: v for k, v in self._factor_cache.items() if k[1] != layer}
        self.scales_version += 1
        if all(self._calibrated):
            log.info(
                "KV scales calibrated from the first prefill (%s): K %.4g..%.4g, V %.4g..%.4g",
                self.granularity,
                self.k_scale.min(),
                self.k_scale.max(),
                self.v_scale.min(),
                self.v_scale.max(),
            )

    def _scales(self, layer: int) -> torch.Tensor:
        """[2, heads or 1, 1] K and V scales of a layer, broadcastable over [T, 2, heads, dim]."""
        cached = self._scale_cache.get(layer)
        if cached is None:
            values = torch.stack((self.k_scale[layer], self.v_scale[layer])).view(2, -1, 1)
            cached = self._scale_cache[layer] = values.to(self.device)
        return cached

    # ----- write and read -----------------------------------------------------
    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Store new tokens' K and V ([T, kv_heads, head_dim]) at their slots."""
        kv = torch.stack((k, v), dim=1)  # [T, 2, kv_heads, head_dim]
        if self.is_fp8:
            if not self._calibrated[layer]:
                warn_if_short_calibration(layer, k.shape[0])
                self._calibrate(layer, k, v)
            if self._observed is not None:
                for seen, x in zip(self._observed, (k, v), strict=True):
                    seen[layer] = torch.maximum(seen[layer], observed_amax(x, self.per_head))
            kv = quantize_fp8(kv, self._scales(layer)).view(torch.uint8)
        else:
            kv = kv.to(self.storage.dtype)
        self.storage[layer].index_copy_(0, slots, kv)

    def _factors(self, layer: int) -> tuple:
        """Dequant factors of a layer: floats per layer, float32 [kv_heads] tensors per head."""

        def build() -> tuple:
            scales = (self.k_scale[layer], self.v_scale[layer])
            if self.per_head:
                return tuple((s * HALF_TRICK_FACTOR).to(self.device) for s in scales)
            return tuple(float(s) * HALF_TRICK_FACTOR for s in scales)

        return self._cached("factors", layer, build)

    def writes_plainly(self, layer: int | None = None) -> bool:
        """Whether `write` only stores (quantizes) values, for a layer or all of them:
        nothing left to calibrate and no maxima being observed. Always so for a
        BF16 or float32 cache."""
        calibrated = all(self._calibrated) if layer is None else self._calibrated[layer]
        return not self.is_fp8 or (calibrated and self._observed is None)

    def _heads_on_cpu(self, values) -> tuple[torch.Tensor, torch.Tensor]:
        heads = self.layout.num_kv_heads
        return tuple(
            torch.as_tensor(v, dtype=torch.float32).reshape(-1).expand(heads).contiguous().cpu()
            for v in values
        )

    def write_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K and V scales [kv_heads] (float32, CPU) for writing a layer as `write` would,
        or None unless `writes_plainly(layer)`. A BF16 or float32 cache has ones."""
        if not self.writes_plainly(layer):
            return None
        return self._cached(
            "write", layer, lambda: self._heads_on_cpu((self.k_scale[layer], self.v_scale[layer]))
        )

    def head_factors(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`_factors` as float32 [kv_heads] tensors on the CPU (what CPU kernels take)."""
        return self._cached(
            "per_head",
            layer,
            lambda: self._heads_on_cpu(self._factors(layer) if self.is_fp8 else (1.0, 1.0)),
        )

    def gather(
        self, layer: int, slots: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, float | torch.Tensor, float | torch.Tensor]:
        """K and V at `slots` (any shape) in `dtype`, plus the factors that dequantize them.

        The true values are `k * k_factor` and `v * v_factor`, the factors being
        floats (per-layer scales) or float32 [kv_heads] tensors (per-head
        scales, applying to dim -2 of k and v). Attention folds them into its
        query or softmax scale and its output instead of spending a pass over
        K and V.
        """
        kv = self.storage[layer].index_select(0, slots.reshape(-1))
        if self.is_fp8:
            kv = fp8_bits_to_half(kv).to(dtype)
            k_factor, v_factor = self._factors(layer)
        else:
            kv = kv.to(dtype)
            k_factor = v_factor = 1.0
        kv = kv.view(*slots.shape, 2, self.layout.num_kv_heads, self.layout.head_dim)
        return kv.select(-3, 0), kv.select(-3, 1), k_factor, v_factor
