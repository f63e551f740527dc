"""The prefix cache and its tiers, built and wired in one place by the engine that owns them.

The radix tree (engine/kv/radix.py) keeps prompts' pages for reuse; the disk
tier (engine/kv/prefix_store.py) saves and restores them across processes;
the spill tier (engine/kv/prefix_spill.py) copies pinned pages out when they
give way and brings them back. The tiers are handed only what they use
(engine/kv/prefix_tier_parts.py), and their hooks are connected here, by their
owner: the tree's `spill` and the scheduler's `restore` (engine/core/engine_parts.py
passes `restore_hook` to the Scheduler).

A model with recurrent state (Kimi Linear's KDA layers) gets a tree that also
keeps snapshots of that state at page boundaries (engine/kv/prefix_snapshots.py;
the entries' tensors are the rank's snapshot pool, engine/kv/state_budget.py
sizes it): a cached prefix's pages hold only its MLA layers' KV, and are reused
only up to a page whose state was kept. The tiers carry a page's snapshot with
its bytes. With no room for snapshots in the KV budget, such a model gets no
prefix cache, and every request prefills in full; this is logged once at start.

With `kv_events` set, a KV-event publisher (engine/kv/kv_event_publisher.py) is
started here too, and its recorder handed to the tree and the tiers as they are
built: they report the pages they store and remove, the tree its clears.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.execution.rank_model import RankModel
from engine.kv.kv_event_publisher import KVEventPublisher, open_publisher
from engine.kv.kv_events import parse_kv_events
from engine.kv.pages import PageAllocator
from engine.kv.prefix_snapshots import PrefixSnapshots
from engine.kv.prefix_spill import PrefixSpill, open_prefix_spill
from engine.kv.prefix_store import PrefixStore, open_prefix_store
from engine.kv.prefix_tier_parts import FingerprintFacts, PrefixTierParts
from engine.kv.radix import RadixCache

log = logging.getLogger(__name__)


@dataclass
class PrefixTiers:
    cache: RadixCache | None  # None: prefix caching is off, and so are the tiers
    store: PrefixStore | None  # the disk tier, when kv_disk asks for it
    spill: PrefixSpill | None  # pinned pages giving way (to host memory or disk), and back
    events: KVEventPublisher | None = None  # KV events (kv_events), or None

    def kv_event_sources(self) -> dict:
        """Where KV events are published, as vllm-router's discovery reads it
        (engine/kv/kv_events.py); `{}` when they are off."""
        return self.events.settings.event_sources() if self.events is not None else {}

    def close(self) -> None:
        """Stop the KV-event publisher, if any (after sending what is waiting)."""
        if self.events is not None:
            self.events.close()

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

    def flush(self) -> dict[str, int]:
        """Forget every cached prefix (a router's or an operator's /flush_cache): the
        tree's pages no request holds, pinned ones too, through the tree's own clear
        (so whatever watches its evictions sees them go), then the host tier's copies
        and this engine's page files on disk, each through its tier (so their KV
        events say so too). Pinned prefixes keep their pins (the
        handles stay valid) and are cached, and protected, again at their next prefill;
        pages running requests hold stay, and enter the tree as usual when they finish.
        Returns what was dropped and what was kept."""
        keys = ("tokens", "pinned_tokens", "in_use_tokens", "host_pages", "host_bytes")
        report = dict.fromkeys((*keys, "disk_pages", "disk_bytes"), 0)
        cache = self.cache
        if cache is None:
            return report
        pages, spilled = cache.num_pages, cache.spilled_pages()
        cache.clear(pinned=True)  # pinned pages give way uncopied: a flush keeps nothing
        report["tokens"] = (pages - cache.num_pages) * cache.page_size
        report["pinned_tokens"] = (cache.spilled_pages() - spilled) * cache.page_size
        report["in_use_tokens"] = cache.num_pages * cache.page_size
        # Through the tiers' own methods, so their KV events report what went.
        if self.spill is not None:
            report["host_pages"], report["host_bytes"] = self.spill.clear_host()
        if self.store is not None:
            report["disk_pages"], report["disk_bytes"] = self.store.remove_pages()
        return report


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
    snapshots = None
    if rank.state_pool is not None:
        if rank.snapshot_pool is None:
            log.info(
                "prefix caching is off for %s: a cached prefix also needs its layers' "
                "recurrent state at its end, and the KV budget leaves no room for those "
                "snapshots (raise --kv-memory); every prompt prefills in full",
                rank.model_config.architecture,
            )
            return PrefixTiers(cache=None, store=None, spill=None)
        snapshots = PrefixSnapshots(rank.snapshot_pool.num_slots)
    publisher = open_publisher(parse_kv_events(config.kv_events), config.page_size)
    recorder = publisher.recorder if publisher is not None else None
    try:
        cache = RadixCache(
            allocator,
            config.page_size,
            page_bytes=rank.pool.page_bytes,
            verify=config.verify_prefix_cache,
            events=recorder,
            snapshots=snapshots,
        )
        parts = PrefixTierParts(
            rank.pool,
            allocator,
            cache,
            fingerprint_facts(config, rank, model_dir, device),
            states=rank.snapshot_pool,
        )
        store = open_prefix_store(parts, config, tensor_parallel, recorder)
        spill = open_prefix_spill(parts, store, config, device.type, recorder)
    except BaseException:
        if publisher is not None:
            publisher.close()
        raise
    # Pinned pages giving way are copied out before their pages return to the pool.
    cache.spill = spill.spill
    return PrefixTiers(cache=cache, store=store, spill=spill, events=publisher)


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
