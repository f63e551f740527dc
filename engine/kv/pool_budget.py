"""How many pages the KV pool gets, and the pool itself with its fixed scales.

The budget is what the user gave (`kv_memory_gib`), else 85% of the GPU's
free memory, else the CPU default (and always room for one full-length
sequence). The pool takes the whole pages that fit; with tensor parallelism
the smallest count any rank can hold, because page tables are global (rank 0
schedules pages for all). A hybrid model's recurrent-state pool comes out
of the same budget first (`reserved_bytes`: a fixed state per sequence that
may run, engine/kv/state_pool.py), and the pages take what is left. A budget
that cannot hold one sequence of `max_model_len` is refused with the setting
to change.
"""

from __future__ import annotations

import logging

import torch

from engine.collectives import parallel
from engine.errors import KVCapacityError
from engine.kv.pool import PagedKVPool
from engine.kv.pools import make_pool
from engine.kv.scales import apply_fixed_scales
from engine.kv.sizing import KVLayout, capacity_tokens, kv_bytes_per_token

log = logging.getLogger(__name__)
GIB = 1024**3
# Of the GPU's free memory after the weights: the rest is for activations and graphs.
GPU_FREE_FRACTION = 0.85


def kv_budget_bytes(
    kv_memory_gib: float | None,
    device: torch.device,
    max_model_len: int,
    per_token: int,
    cpu_default_gib: float,
) -> int:
    """The bytes the KV pool may take (see the module docstring)."""
    if kv_memory_gib is not None:
        return int(kv_memory_gib * GIB)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_FREE_FRACTION)
    # Enough for the default CPU budget, and always for one full-length sequence.
    return max(int(cpu_default_gib * GIB), 2 * max_model_len * per_token)


def allocate_kv_pool(
    layout: KVLayout,
    kv_dtype: str,
    *,
    page_size: int,
    max_model_len: int,
    device: torch.device,
    kv_memory_gib: float | None,
    cpu_default_gib: float,
    per_head: bool,
    rotation: str,
    scales_file: dict | None,
    ckpt_scales,
    reserved_bytes: int = 0,
) -> PagedKVPool:
    """The pool this rank holds, sized to the budget less `reserved_bytes` (the
    recurrent states' share), its fixed scales applied."""
    page = page_size
    per_token = kv_bytes_per_token(layout, kv_dtype)
    budget = kv_budget_bytes(kv_memory_gib, device, max_model_len, per_token, cpu_default_gib)
    states = f" after {reserved_bytes / GIB:.3f} GiB of recurrent states" if reserved_bytes else ""
    budget -= reserved_bytes
    num_pages = capacity_tokens(budget, layout, kv_dtype, page) // page
    if parallel.tp_size() > 1:
        from engine.collectives.agreement import min_over_ranks

        # Page tables are global: every rank holds the pages the smallest can.
        num_pages = min_over_ranks(num_pages)
    capacity = num_pages * page
    if capacity < max_model_len:
        raise KVCapacityError(
            f"the KV budget of {budget / GIB:.3f} GiB{states} holds {capacity} tokens "
            f"({per_token} bytes/token in {kv_dtype}), less than one sequence of "
            f"max_model_len={max_model_len}; raise --kv-memory to at least "
            f"{(max_model_len * per_token + reserved_bytes) / GIB:.3f} GiB or lower "
            "--max-model-len (or --max-num-seqs, which sets how many recurrent states are kept)"
        )
    pool = make_pool(layout, num_pages, page, kv_dtype, device, per_head)
    apply_fixed_scales(pool, rotation, scales_file, ckpt_scales, per_head)
    log.info(
        "KV cache: %s, %d pages of %d tokens = %d tokens, %.3f GiB, scales from %s",
        kv_dtype,
        num_pages,
        page,
        capacity,
        pool.nbytes / GIB,
        pool.scale_source,
    )
    return pool
