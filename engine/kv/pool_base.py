"""What every paged KV pool shares: page geometry, storage size, page bytes, scale checks.

The GQA pool (per-head K and V) and the MLA pool (one latent row) differ in
what a slot holds and how it is quantized, not in how pages are laid out.
"""

from __future__ import annotations

import logging

import torch

from engine.kv.dtypes import FP8_KV_DTYPE, KV_DTYPE_BYTES
from engine.kv.sizing import KVLayout

# Each declared KV dtype's torch storage (engine/kv/dtypes.py names them). fp8 is
# stored as uint8: index_copy_ and index_select are not defined for float8 on
# every torch build, and the bytes are the same.
_TORCH_STORAGE = {"bf16": torch.bfloat16, "float32": torch.float32, FP8_KV_DTYPE: torch.uint8}
STORAGE_DTYPES = {name: _TORCH_STORAGE[name] for name in KV_DTYPE_BYTES}
assert all(d.itemsize == KV_DTYPE_BYTES[n] for n, d in STORAGE_DTYPES.items()), "bytes differ"


log = logging.getLogger(__name__)

# A first prefill shorter than this sets (and freezes) FP8 scales from too few
# values: on the default model, one token took perplexity to +948%.
SHORT_CALIBRATION_TOKENS = 64


def warn_if_short_calibration(layer: int, tokens: int) -> None:
    """Say so, once per pool (at layer 0), when first-prefill calibration sees few tokens."""
    if layer == 0 and tokens < SHORT_CALIBRATION_TOKENS:
        log.warning(
            "FP8 KV scales are being set from a first prefill of only %d tokens and then "
            "frozen: longer texts may clip. Give fixed scales (kv_scales_file, written by "
            "`resident models calibrate`) or call LLM.calibrate_kv_scales first.",
            tokens,
        )


# From this size on a CPU pool is left for the kernel to map on first touch.
LAZY_POOL_BYTES = 64 * 2**20


def allocate_storage(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A pool's storage [layers, slots, ...], zero where it is read before it is written.

    Padded decode rows read slot 0 and multiply it by a zero probability (0 * NaN from
    uninitialised memory would be NaN); every other slot is written before it is read.
    A large CPU pool is allocated without being written (a block this size comes from
    the kernel as fresh pages, mapped, and zero, on first touch) and only slot 0 is
    zeroed, so the pool becomes resident as tokens fill it rather than at start: the
    default 1 GiB CPU pool costs nothing until used. Small pools and other devices:
    zeros."""
    numel = 1
    for size in shape:
        numel *= size
    big = numel * torch.empty((), dtype=dtype).element_size() >= LAZY_POOL_BYTES
    if torch.device(device).type != "cpu" or not big:
        return torch.zeros(shape, dtype=dtype, device=device)
    storage = torch.empty(shape, dtype=dtype)
    storage[:, 0].zero_()
    return storage


class PagedPoolBase:
    layout_kind = ""  # "gqa" or "mla", checked against the layout given

    def __init__(
        self,
        layout: KVLayout,
        num_pages: int,
        page_size: int,
        kv_dtype: str,
        device: torch.device | str = "cpu",
    ):
        if layout.kind != self.layout_kind:
            raise ValueError(
                f"{type(self).__name__} stores {self.layout_kind.upper()} layouts, "
                f"not {layout.kind.upper()}"
            )
        if kv_dtype not in STORAGE_DTYPES:
            raise ValueError(f"kv dtype {kv_dtype!r}: use one of {sorted(STORAGE_DTYPES)}")
        self.layout = layout
        self.num_pages = num_pages
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        self.is_fp8 = kv_dtype == FP8_KV_DTYPE
        self.device = torch.device(device)
        self.storage_dtype = STORAGE_DTYPES[kv_dtype]
        self.storage: torch.Tensor  # [layers, slots, ...], set by the subclass

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def page_regions(self) -> tuple[torch.Tensor, ...]:
        """The storages a page spans, each [layers, slots, ...]: the pool's one storage,
        plus any second region a subclass keeps beside it (DSA's indexer keys,
        engine/kv/dsa_pool.py). A page's bytes are its rows in every region, in this
        order, so the prefix cache's tiers and checks carry all of them."""
        return (self.storage,)

    @property
    def nbytes(self) -> int:
        return sum(region.numel() * region.element_size() for region in self.page_regions())

    def page_bytes(self, page: int) -> bytes:
        """The stored bytes of one page across all layers (prefix-cache verification)."""
        start = page * self.page_size
        parts = []
        for region in self.page_regions():
            rows = region[:, start : start + self.page_size].contiguous()
            parts.append(_raw(rows).cpu().numpy().tobytes())
        return b"".join(parts)

    def load_page_bytes(self, page: int, data: bytes) -> None:
        """Put back bytes `page_bytes` returned (the disk tier's restore): the same
        storage bytes, so a restored page is byte-identical to the saved one."""
        start = page * self.page_size
        regions = [region[:, start : start + self.page_size] for region in self.page_regions()]
        expected = sum(rows.numel() * rows.element_size() for rows in regions)
        if len(data) != expected:
            raise ValueError(f"a page holds {expected} bytes, not {len(data)}")
        offset = 0
        for rows in regions:
            target = _raw(rows)
            size = rows.numel() * rows.element_size()
            piece = bytearray(data[offset : offset + size])
            values = torch.frombuffer(piece, dtype=target.dtype).view(target.shape)
            target.copy_(values.to(self.device))
            offset += size

    def _slots(self, pages: list[int]) -> torch.Tensor:
        offsets = torch.arange(self.page_size)
        return (torch.tensor(pages).view(-1, 1) * self.page_size + offsets).view(-1)

    def _page_sizes(self) -> list[int]:
        return [region[:, : self.page_size].nbytes for region in self.page_regions()]

    def pages_bytes(self, pages: list[int]) -> list[bytes]:
        """`page_bytes` of several pages with one gather and one copy to the host per
        region (the spill tier copies a whole evicted run of pages off a GPU at once)."""
        if not pages:
            return []
        slots = self._slots(pages).to(self.device)
        per_region = []
        for region in self.page_regions():
            rows = region[:, slots]
            rows = rows.view(rows.shape[0], len(pages), self.page_size, *rows.shape[2:])
            raw = rows.movedim(1, 0).contiguous().cpu().view(torch.uint8).view(len(pages), -1)
            per_region.append([memoryview(page.numpy()) for page in raw])
        return [b"".join(parts) for parts in zip(*per_region, strict=True)]

    def load_pages_bytes(self, pages: list[int], data: list[bytes]) -> None:
        """Put back what `pages_bytes` returned, one copy to the device per region."""
        sizes = self._page_sizes()
        expected = sum(sizes)
        if len(data) != len(pages) or any(len(d) != expected for d in data):
            raise ValueError(f"each page holds {expected} bytes; got {[len(d) for d in data]}")
        if not pages:
            return
        slots = self._slots(pages).to(self.device)
        offset = 0
        for region, size in zip(self.page_regions(), sizes, strict=True):
            joined = b"".join(d[offset : offset + size] for d in data)
            flat = torch.frombuffer(bytearray(joined), dtype=torch.uint8)
            shape = (len(pages), region.shape[0], self.page_size, *region.shape[2:])
            values = flat.view(region.dtype).view(shape).movedim(0, 1)
            values = values.reshape(region.shape[0], -1, *region.shape[2:])
            region[:, slots] = values.to(self.device)
            offset += size

    def checked_scales(
        self, first: torch.Tensor, second: torch.Tensor, names: str, heads: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Two float32 scale tensors, validated (count, shape and sign).

        Each is per layer, [layers], or, where `heads` is given, may be per
        layer and head, [layers, heads]; both must have the same form.
        """
        n = self.layout.num_layers
        first = torch.as_tensor(first, dtype=torch.float32).clone()
        second = torch.as_tensor(second, dtype=torch.float32).clone()
        if heads is not None and first.dim() == 2 and first.shape == second.shape == (n, heads):
            pass  # per layer and KV head
        else:
            first, second = first.flatten(), second.flatten()
            if first.numel() != n or second.numel() != n:
                form = f"{n} or {n}x{heads}" if heads is not None else f"{n}"
                raise ValueError(
                    f"expected {form} {names} scales, got {tuple(first.shape)}/{tuple(second.shape)}"
                )
        if bool((first <= 0).any() or (second <= 0).any()):
            raise ValueError("KV scales must be positive")
        if not bool(torch.isfinite(first).all() and torch.isfinite(second).all()):
            raise ValueError("KV scales must be finite")
        return first, second


def _raw(rows: torch.Tensor) -> torch.Tensor:
    """Rows viewed as integers of their element size or two bytes (the bytes unchanged)."""
    return rows.view(torch.uint8) if rows.element_size() == 1 else rows.view(torch.int16)
