"""The prefix cache and its tiers, built and wired in one place by the engine that owns them.

The radix tree (engine/kv/radix.py) keeps prompts' pages for reuse; the disk
tier (engine/kv/prefix_store.py) saves and restores them across processes;
the spill tier (engine/kv/prefix_spill.py) copies pinned pages out when they
give way and brings them back. The tiers are handed only what they use
(engine/kv/prefix_tier_parts.py), and their hooks are connected here, by their
owner: the tree's `spill` and the scheduler's `restore` (engine/core/engine_parts.py
passes `restore_hook` to the Scheduler).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.execution.rank_model import RankModel
from engine.kv.pages import PageAllocator
from engine.kv.prefix_spill import PrefixSpill, open_prefix_spill
from engine.kv.prefix_store import PrefixStore, open_prefix_store
from engine.kv.prefix_tier_parts import FingerprintFacts, PrefixTierParts
from engine.kv.radix import RadixCache


@dataclass
class PrefixTiers:
    cache: RadixCache | None  # None: prefix caching is off, and so are the tiers
    store: PrefixStore | None  # the disk tier, when kv_disk asks for it
    spill: PrefixSpill | None  # pinned pages giving way (to host memory or disk), and back

    @property
    def restore_hook(self) -> Callable[[list[int], str], int] | None:
        """What the scheduler calls before reusing a new prompt's cached prefix."""
        return self.spill.restore if self.spill is not None else None

    def pin(self, token_ids: list[int], cache_salt: str = "") -> list:
        """Protect the cached pages of this prefix from eviction; returns a handle for unpin.

        Under pressure pinned pages still give way, last (engine/kv/prefix_spill.py): they
        stay pinned in the tree without a page until restored or prefilled again."""
        if self.cache is None:
            return []
        nodes = self.cache.match(list(token_ids) + [0], cache_salt, record=False).nodes
        self.cache.pin(nodes)
        return nodes

    def unpin(self, handle: list) -> None:
        if self.cache is not None:
            self.cache.unpin(handle)

    def save(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Write this prefix's cached pages to the disk tier; returns pages newly written."""
        if self.store is None:
            return 0
        return self.store.save(list(token_ids), cache_salt)

    def restore(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Load this prefix's saved pages into the prefix cache; returns tokens restored."""
        if self.store is None:
            return 0
        return self.store.restore(list(token_ids), cache_salt)


def open_prefix_tiers(
    config: EngineConfig,
    rank: RankModel,
    allocator: PageAllocator,
    model_dir: Path,
    device: torch.device,
    tensor_parallel: bool,
) -> PrefixTiers:
    """The tree, and the tiers behind it that `config` asks for, hooked together."""
    if not config.enable_prefix_caching:
        return PrefixTiers(cache=None, store=None, spill=None)
    cache = RadixCache(
        allocator,
        config.page_size,
        page_bytes=rank.pool.page_bytes,
        verify=config.verify_prefix_cache,
    )
    parts = PrefixTierParts(
        rank.pool, allocator, cache, fingerprint_facts(config, rank, model_dir, device)
    )
    store = open_prefix_store(parts, config, tensor_parallel)
    spill = open_prefix_spill(parts, store, config, device.type)
    # Pinned pages giving way are copied out before their pages return to the pool.
    cache.spill = spill.spill
    return PrefixTiers(cache=cache, store=store, spill=spill)


def fingerprint_facts(
    config: EngineConfig, rank: RankModel, model_dir: Path, device: torch.device
) -> FingerprintFacts:
    """What decides the K/V bytes this engine's prefills write (saved pages' key)."""
    return FingerprintFacts(
        model_dir=model_dir,
        architecture=rank.model_config.architecture,
        dtype=rank.dtype,
        kv_cache_dtype=rank.kv_dtype,
        page_size=config.page_size,
        layout=rank.layout,
        kv_rotation=rank.kv_rotation,
        kv_rotation_detail=rank.kv_rotation_detail,
        attention_backend=rank.runner.backend.name,
        cpu_kernel=rank.cpu_kernel,
        cpu_weights=config.cpu_weights,
        deterministic=config.deterministic,
        device_type=device.type,
    )
