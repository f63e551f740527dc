"""The paged latent pool for multi-head latent attention (MLA: DeepSeek V3, Kimi K2.x).

MLA caches no per-head K or V. Each token keeps one row per layer:
`[latent (kv_lora_rank) | rope key (qk_rope_head_dim)]`, 512 + 64 = 576 values
for Kimi. The latent serves as both K and V (heads expand it through
kv_b_proj, or absorb that matrix into q and the output), so it needs one
scale; the rope key has its own scale because its range differs (it is
rotated but not normalised). Rows sit at `slot = page * page_size + offset`,
as in the GQA pool, so the page allocator and prefix cache treat both alike.

In fp8 mode rows are stored as e4m3 bytes, quantized on write with the
saturating clamp (DESIGN.md §3); scales come from `set_scales` (checkpoint or
file), else from the first write of each layer (amax / 448 with headroom),
then stay frozen (`observe` collects the maxima of everything written, for
calibrating over a prompt set). There is no per-head form: the latent is
shared by all heads. Gather returns the bytes decoded exactly but unscaled, plus
the factors that finish the job, so attention can fold them into the query
and the output instead of spending a pass over the context.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class MLALayout(KVLayout):
    """A KVLayout of kind "mla" that also says how many trailing values are the rope key."""

    rope_dim: int = 0

    @property
    def lora_rank(self) -> int:
        return self.latent_dim - self.rope_dim


class MLALatentPool(PagedPoolBase):
    layout_kind = "mla"

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
        self.rope_dim = getattr(layout, "rope_dim", 0)
        if not 0 < self.rope_dim < layout.latent_dim:
            raise ValueError("the MLA pool needs an MLALayout that says where the rope key starts")
        self.lora_rank = layout.latent_dim - self.rope_dim
        shape = (layout.num_layers, num_pages * page_size, layout.latent_dim)
        # uint8 for fp8: index_copy_/index_select are not defined for float8 on
        # every torch build, and the bytes are the same. Slot 0 zero (allocate_storage).
        self.storage = allocate_storage(shape, self.storage_dtype, self.device)
        self.latent_scale = torch.ones(layout.num_layers, dtype=torch.float32)
        self.rope_scale = torch.ones(layout.num_layers, dtype=torch.float32)
        self.scale_source = scale_source if self.is_fp8 else "none"
        self._calibrated = [scale_source != "calibrate"] * layout.num_layers
        self._observed: tuple[torch.Tensor, torch.Tensor] | None = None
        # Bumped whenever a scale changes: holders of the scales (a fused decode step's
        # description of the layers) rebuild.
        self.scales_version = 0

    granularity = "per_layer"

    @property
    def calibrated_layers(self) -> int:
        return sum(self._calibrated)

    def observe(self, enabled: bool = True) -> None:
        """Start (or stop) recording the |max| of the latents and rope keys written, per layer."""
        self._observed = (
            (torch.zeros_like(self.latent_scale), torch.zeros_like(self.rope_scale))
            if enabled
            else None
        )

    def observed_scales(self, margin: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent and rope scales from what `observe` recorded (amax / 448 with the margin)."""
        if self._observed is None:
            raise RuntimeError("observe() was not started")
        kwargs = {} if margin is None else {"margin": margin}
        return tuple(scale_from_amax(amax, **kwargs) for amax in self._observed)

    def set_scales(self, latent_scale: torch.Tensor, rope_scale: torch.Tensor, source: str) -> None:
        """Use fixed per-layer scales for the latent and for the rope key."""
        self.latent_scale, self.rope_scale = self.checked_scales(
            latent_scale, rope_scale, "latent and rope"
        )
        self.scale_source = source
        self._calibrated = [True] * self.layout.num_layers
        self.scales_version += 1

    def writes_plainly(self, layer: int | None = None) -> bool:
        """Whether `write` only stores (quantizes) rows, for a layer or all of them:
        nothing left to calibrate and no maxima being observed. Always so for a BF16
        or float32 cache."""
        calibrated = all(self._calibrated) if layer is None else self._calibrated[layer]
        return not self.is_fp8 or (calibrated and self._observed is None)

    def scales(self) -> dict[str, list[float]]:
        return {"latent": self.latent_scale.tolist(), "rope": self.rope_scale.tolist()}

    def write(
        self, layer: int, latent: torch.Tensor, rope: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """Store new tokens' latent [T, lora_rank] and rotated rope key [T, rope_dim] at `slots`."""
        if self.is_fp8:
            if not self._calibrated[layer]:
                warn_if_short_calibration(layer, latent.shape[0])
                self.latent_scale[layer] = calibrate_scale(latent)
                self.rope_scale[layer] = calibrate_scale(rope)
                self._calibrated[layer] = True
                self.scales_version += 1
            if self._observed is not None:
                for seen, x in zip(self._observed, (latent, rope), strict=True):
                    seen[layer] = torch.maximum(seen[layer], observed_amax(x))
            latent = quantize_fp8(latent, self.latent_scale[layer].item()).view(torch.uint8)
            rope = quantize_fp8(rope, self.rope_scale[layer].item()).view(torch.uint8)
        row = torch.cat([latent.to(self.storage.dtype), rope.to(self.storage.dtype)], dim=-1)
        self.storage[layer].index_copy_(0, slots, row)

    def gather(
        self, layer: int, slots: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, float, float]:
        """Rows at `slots` (any shape) in `dtype`, plus the latent and rope dequant factors.

        The true values are `rows[..., :lora_rank] * latent_factor` and
        `rows[..., lora_rank:] * rope_factor`.
        """
        rows = self.storage[layer].index_select(0, slots.reshape(-1))
        rows = rows.view(*slots.shape, self.layout.latent_dim)
        if self.is_fp8:
            rows = fp8_bits_to_half(rows)
        return (rows.to(dtype), *self.dequant_factors(layer))

    def dequant_factors(self, layer: int) -> tuple[float, float]:
        """The latent and rope factors of `gather`, for kernels that decode the stored rows
        themselves (FP8 bytes read as the half holding value * 2**-8, as gather does)."""
        if not self.is_fp8:
            return 1.0, 1.0
        return (
            float(self.latent_scale[layer]) * HALF_TRICK_FACTOR,
            float(self.rope_scale[layer]) * HALF_TRICK_FACTOR,
        )
