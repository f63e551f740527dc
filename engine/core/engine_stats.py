"""What an engine reports about itself (`/v1/engine/stats`, `resident bench`, the agent's
status bar): the KV cache's dtype, capacity, use and scales, the kernels and
backend in force, weights, speculation, the prefix tiers, ranks and queues; and,
cheaply, its load alone (`engine_load`: what routers poll through /get_load).
"""

from __future__ import annotations

import torch

from engine.core.engine_parts import EngineParts
from engine.host.cpu_features import describe_cpu
from engine.kv.scales import scales_in_force
from engine.kv.sizing import kv_bytes_per_token
from engine.layers.cpu_matrix_path import describe_matrix_path


def _pages_in_use(parts: EngineParts) -> tuple[int, int]:
    """(pages held by requests, pages held only by the prefix cache)."""
    cache = parts.prefix.cache
    cache_only = cache.pages_held_only_by_cache() if cache is not None else 0
    return parts.allocator.num_pages - parts.allocator.num_free - cache_only, cache_only


def engine_stats(parts: EngineParts) -> dict:
    """The stats object; read on the stepping thread (its compute threads are reported)."""
    page = parts.config.page_size
    rank, cache, spill = parts.rank, parts.prefix.cache, parts.prefix.spill
    used_pages, cache_only = _pages_in_use(parts)
    runner = rank.runner
    # Triton's backend says whether FP8 pages decode on e4m3 tensor cores.
    describe_backend = getattr(runner.backend, "describe", None)
    backend_facts = describe_backend(rank.pool, rank.dtype) if describe_backend else {}
    return {
        "kv_cache_dtype": rank.kv_dtype,
        "page_size": page,
        "capacity_tokens": rank.pool.capacity_tokens,
        "used_tokens": used_pages * page,
        "cached_tokens": cache_only * page,
        "cache_hit_rate": cache.hit_rate if cache else 0.0,
        "max_context_tokens": rank.max_model_len,
        "kv_bytes_per_token": kv_bytes_per_token(rank.layout, rank.kv_dtype),
        # A hybrid model's fixed per-sequence states, beside the pages (engine/kv/state_pool.py).
        **({"recurrent_state_bytes": rank.state_pool.nbytes} if rank.state_pool else {}),
        **_snapshot_stats(parts),
        "kv_rotation": rank.kv_rotation,
        "kv_scales": scales_in_force(rank.pool, rank.kv_rotation),
        "attention_backend": runner.backend.name,
        **backend_facts,
        "cpu_kernel": rank.cpu_kernel,
        **(runner.graphs.describe() if runner.graphs is not None else {}),
        # The stepping thread's team (this runs on it): engine.host.threads.
        "compute_threads": torch.get_num_threads(),
        **({**describe_cpu(), **describe_matrix_path()} if parts.device.type == "cpu" else {}),
        "weight_bytes": parts.weight_bytes,
        "linear_methods": parts.linear_methods,
        **parts.speculator.stats(),
        **(spill.stats() if spill is not None else {}),
        **(parts.prefix.events.stats() if parts.prefix.events is not None else {}),
        "parallel": parts.executor.describe(),
        "running": len(parts.scheduler.running),
        "waiting": len(parts.scheduler.waiting),
    }


def _snapshot_stats(parts: EngineParts) -> dict:
    """A hybrid model's prefix-cache snapshots of its states (engine/kv/prefix_snapshots.py):
    their memory, how many cached pages hold one, how many gave way to newer ones."""
    pool, cache = parts.rank.snapshot_pool, parts.prefix.cache
    snapshots = cache.snapshots if cache is not None else None
    if pool is None or snapshots is None:
        return {}
    return {
        "recurrent_snapshot_bytes": pool.nbytes,
        "recurrent_snapshots_held": snapshots.num_held,
        "recurrent_snapshots_dropped": snapshots.dropped,
    }


def engine_load(parts: EngineParts) -> dict:
    """Requests running and waiting, the tokens waiting requests still have to compute,
    and KV use: a few counts, cheap enough to be polled (engine thread)."""
    page, scheduler = parts.config.page_size, parts.scheduler
    used_pages, cache_only = _pages_in_use(parts)
    return {
        "running": len(scheduler.running),
        "waiting": len(scheduler.waiting),
        "waiting_tokens": sum(seq.num_uncomputed for seq in scheduler.waiting),
        "used_tokens": used_pages * page,
        "cached_tokens": cache_only * page,
        "capacity_tokens": parts.rank.pool.capacity_tokens,
    }
