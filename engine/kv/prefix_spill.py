"""Pinned prefix pages that give way under pool pressure: spilled out, brought back.

When a request needs pages that neither free nor unpinned cached pages can
cover, the radix tree lets pinned leaves no sequence holds go (least recently
used first, tail before head) and keeps them as spilled nodes, pins and all
(engine/kv/radix.py). Before their pages return to the pool, `spill` copies
their bytes out:

- to the host tier (engine/kv/host_tier.py), when it is on: by default where
  the pool is on a GPU (host memory is larger and a copy over PCIe is far
  cheaper than a prefill); what its budget pushes out goes on to the disk tier;
- else to the disk tier (engine/kv/disk_tier.py), when it is on (a CPU pool:
  its pages are host memory already, so a host tier would only move them);
- else nowhere: the pages are dropped as unpinned ones are, and the next turn
  prefills them again (and they are pinned again as they enter the tree).

A page's bytes are everything a restore needs to be byte-identical: the
pool's storage for that page across all layers, and for a hybrid model the
recurrent-state snapshot its node kept, if any (engine/kv/prefix_snapshots.py),
which comes back into a snapshot entry of the restored node. FP8 scales are per layer (or
per KV head) for the whole pool, not per page; they enter the key instead
(the digest of the scales in force roots the chain), as on disk, so pages
come back only into a pool with the same scales.

`restore` runs when a new request is scheduled (Scheduler._reuse_cached_prefix):
if its prompt continues the tree's cached prefix into pages that gave way,
it takes them from the host tier, or, for a prompt that reaches a spilled
node, from the disk tier, into fresh pages (free ones, or unpinned cached
ones evicted; never by making other pinned pages give way) and into the tree,
so the request counts them as cached tokens. A missing, damaged or mismatched
entry stops the restore there: the rest is prefilled, never read wrongly.
With tensor parallelism each rank holds only its shard of every page, so
both tiers are off and pinned pages that give way are dropped.

With KV events on, the host tier's pages are reported with medium CPU (stored
when spilled into it, removed when taken back or pushed out) and those it
writes to the disk tier with medium STORAGE (engine/kv/prefix_store.py), under
the block hashes the tree gave them (engine/kv/radix.py); a flush (`clear_host`)
reports every host page removed.
"""

from __future__ import annotations

import logging
import os

from engine.kv.disk_tier import DamagedPage, PageRecord, chain_keys, page_key, root_key
from engine.kv.host_tier import HostEntry, HostTier
from engine.kv.kv_event_recorder import KVEventSink, TierEvents
from engine.kv.kv_events import MEDIUM_CPU
from engine.kv.prefix_store import PrefixStore, SaveJob, scales_state
from engine.kv.prefix_tier_parts import PrefixTierParts, TierSettings, engine_fingerprint
from engine.kv.radix import RadixCache, RadixNode

log = logging.getLogger(__name__)
GIB = 1024**3
# The host tier's default on a GPU: as much as the disk tier keeps by default (the
# pinned prefixes it exists for: ~700k tokens of SmolLM2's FP8 KV, ~45k of
# GLM-4.6's), capped at a quarter of the host's RAM so weights loading through
# host memory and the rest of the process keep room.
DEFAULT_HOST_GIB = 8.0


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return int(4 * DEFAULT_HOST_GIB * GIB)  # unknown: let the default stand


def host_budget_bytes(config: TierSettings, device_type: str) -> int:
    """The host tier's byte budget for this engine (0: off)."""
    if config.tensor_parallel_size > 1:
        return 0  # rank 0 holds only its shard of each page
    if config.kv_host_gib is not None:
        return int(config.kv_host_gib * GIB)
    if device_type == "cpu":
        return 0
    return int(min(DEFAULT_HOST_GIB * GIB, physical_memory() / 4))


class PrefixSpill:
    def __init__(
        self,
        parts: PrefixTierParts,
        store: PrefixStore | None,
        host_budget: int,
        events: KVEventSink | None = None,
    ):
        # The parts hold the tree weakly: the tree's `spill` hook is a method of this
        # object, and a cycle would keep a dropped engine's pool alive (prefix_tier_parts.py).
        self.parts = parts
        self.pool = parts.pool
        self.allocator = parts.allocator
        self.page_size = parts.page_size
        self.store = store  # the disk tier, or None
        self.host = HostTier(host_budget) if host_budget > 0 else None
        # KV events of the host tier's pages (medium CPU), when they are on.
        self.host_events = (
            TierEvents(events, MEDIUM_CPU) if events is not None and self.host is not None else None
        )
        self._fingerprint: str | None = None
        self.spilled = self.to_host = self.to_disk = self.dropped = 0
        self.from_host = self.from_disk = 0

    @property
    def cache(self) -> RadixCache:
        return self.parts.cache

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:  # reads config.json: only once a tier needs it
            store = self.store
            self._fingerprint = store.fingerprint if store else engine_fingerprint(self.parts)[0]
        return self._fingerprint

    # ----- out ----------------------------------------------------------------------
    def spill(self, victims: list[tuple[RadixNode, int]]) -> None:
        """Copy the pages of pinned nodes giving way to a tier (the radix tree's hook,
        called before the pages return to the pool)."""
        self.spilled += len(victims)
        digest, scales = scales_state(self.pool)
        if (self.host is None and self.store is None) or not digest:
            self.dropped += len(victims)  # no tier, or FP8 bytes under no scale set yet
            return
        places = self._places([node for node, _ in victims], digest)
        try:
            payloads = self.pool.pages_bytes([page for _, page in victims])
            states = [self.parts.snapshot_bytes(node) for node, _ in victims]
        except (RuntimeError, MemoryError) as err:  # e.g. no host memory for the copy
            log.warning("could not copy %d KV pages out of the pool: %s", len(victims), err)
            self.dropped += len(victims)
            return
        entries = [
            HostEntry.of(key, parent, depth, node.tokens, salt, payload, state)
            for (node, _), (key, parent, depth, salt), payload, state in zip(
                victims, places, payloads, states, strict=True
            )
        ]
        blocks = {e.key: node.event_block() for (node, _), e in zip(victims, entries, strict=True)}
        if self.host is not None:
            self.to_host += len(entries)
            out = self.host.put(entries)  # what the budget pushes out goes on
            if self.host_events is not None:
                for entry in entries:
                    if entry.key in self.host and blocks[entry.key] is not None:
                        self.host_events.stored(entry.key, blocks[entry.key])
                announced = self.host_events.blocks  # older entries pushed out
                blocks.update((e.key, announced[e.key]) for e in out if e.key in announced)
                self.host_events.removed([e.key for e in out])
            entries = out
        if entries:
            self._to_disk(entries, digest, scales, blocks)

    def _places(self, nodes: list[RadixNode], digest: str) -> list[tuple]:
        """(key, parent key, depth, salt) of each node: the disk tier's chain keys,
        each ancestor hashed once however many of the nodes share it."""
        memo: dict[int, tuple[bytes, int, str]] = {}  # id(node) -> key, depth, salt

        def place(node: RadixNode) -> tuple[bytes, int, str]:
            path = []
            while id(node) not in memo and node.parent is not None:
                path.append(node)
                node = node.parent
            if id(node) not in memo:  # a root
                memo[id(node)] = (root_key(self.fingerprint, digest, node.salt), -1, node.salt)
            key, depth, salt = memo[id(node)]
            for step in reversed(path):
                key, depth = page_key(key, step.tokens), depth + 1
                memo[id(step)] = (key, depth, salt)
            return key, depth, salt

        out = []
        for node in nodes:
            key, depth, salt = place(node)
            out.append((key, place(node.parent)[0], depth, salt))
        return out

    def _to_disk(
        self, entries: list[HostEntry], digest: str, scales: dict | None, blocks: dict
    ) -> None:
        if self.store is None:
            self.dropped += len(entries)
            return
        tier = self.store.tier
        records = [
            PageRecord(e.key, e.parent, e.depth, list(e.tokens), e.salt, e.payload, e.state)
            for e in entries
            if not tier.has_page(e.depth, e.key) or (e.state and not tier.has_state(e.depth, e.key))
        ]
        try:
            job = SaveJob(records, digest, scales)
            job.blocks.update((e.key, blocks[e.key]) for e in entries if blocks.get(e.key))
            self.store.write(job)
        except OSError as err:  # a full disk or a read-only cache costs a prefill later
            log.warning("KV spill to the disk tier failed: %s", err)
            self.dropped += len(entries)
            return
        self.to_disk += len(entries)

    # ----- back ---------------------------------------------------------------------
    def restore(self, tokens: list[int], salt: str = "") -> int:
        """Bring back the pages of `tokens` past the tree's cached prefix that a tier
        holds; returns the tokens restored."""
        if self.host is None and self.store is None:
            return 0
        ps = self.page_size
        usable = (len(tokens) - 1) // ps  # as RadixCache.match: the last token is computed
        match = self.cache.match(tokens, salt, record=False)
        have = match.num_pages
        from_disk = match.spilled and self.store is not None
        if have >= usable or not (from_disk or (self.host is not None and len(self.host))):
            return 0
        digest = scales_state(self.pool)[0]
        if not digest:
            return 0
        root = root_key(self.fingerprint, digest, salt)
        keys = [root, *chain_keys(root, tokens[: usable * ps], ps)]
        in_host = self.host is not None and keys[have + 1] in self.host
        if not in_host and not (from_disk and self.store.tier.has_page(have, keys[have + 1])):
            return 0
        held = list(match.pages)
        for page in held:  # so that making room cannot evict the prefix being extended
            self.allocator.retain(page)
        try:
            return self._bring_back(tokens, salt, keys, held, from_disk)
        finally:
            self.allocator.release(held)

    def _bring_back(self, tokens, salt, keys, held, from_disk) -> int:
        ps, have = self.page_size, len(held)
        want = 0  # the run of pages a tier holds, looked at without taking them yet
        for depth in range(have, len(keys) - 1):
            key = keys[depth + 1]
            in_host = self.host is not None and key in self.host
            if not (in_host or (from_disk and self.store.tier.has_page(depth, key))):
                break
            want += 1
        if want > self.allocator.num_free:
            # Room from unpinned cached pages only: never make other pinned pages give way.
            self.cache.evict(want - self.allocator.num_free)
        pages, payloads, states, sources = [], [], [], []
        for depth in range(have, have + min(want, self.allocator.num_free)):
            chunk = tokens[depth * ps : (depth + 1) * ps]
            payload, state, source = self._fetch(depth, keys, chunk, from_disk)
            if payload is None:
                break
            payloads.append(payload)
            states.append(state)
            sources.append(source)
        if not payloads:
            return 0
        pages = self.allocator.allocate(len(payloads))
        try:
            self.pool.load_pages_bytes(pages, payloads)
        except ValueError as err:
            self.allocator.release(pages)
            log.warning("spilled KV pages do not fit this pool (%s); prefilling", err)
            return 0
        path = self.cache.insert(tokens[: (have + len(pages)) * ps], held + pages, salt)
        self.allocator.release(pages)  # the tree holds them now
        for node, state in zip(path[have:], states, strict=True):
            self.parts.keep_snapshot(node, state)
        self.from_host += sources.count("host")
        self.from_disk += sources.count("disk")
        if self.store is not None and "disk" in sources:
            self.store.tier.touch(
                [(have + i, keys[have + i + 1]) for i, s in enumerate(sources) if s == "disk"]
            )
        log.debug("restored %d spilled KV pages (%s)", len(pages), ", ".join(set(sources)))
        return len(pages) * ps

    def _fetch(self, depth, keys, chunk, from_disk) -> tuple[bytes | None, bytes, str]:
        """(payload, recurrent state or b"", where from) of one page; no payload: none."""
        key, parent = keys[depth + 1], keys[depth]
        if self.host is not None:
            had = key in self.host
            entry = self.host.take(key, parent, depth, chunk)
            if had and self.host_events is not None:
                self.host_events.removed([key])  # back in the pool, or dropped as damaged
            if entry is not None:
                return entry.payload, entry.state, "host"
        if from_disk:
            try:
                record = self.store.tier.get_page(depth, key, parent, chunk)
                return record.payload, record.state, "disk"
            except FileNotFoundError:
                pass
            except (DamagedPage, OSError) as err:
                log.warning("spilled KV page %d on disk is unusable (%s); prefilling", depth, err)
        return None, b"", ""

    # ----- flush --------------------------------------------------------------------
    def clear_host(self) -> tuple[int, int]:
        """Empty the host tier (a cache flush); (pages, bytes) dropped. With KV events on,
        every page it was reported holding is reported removed (medium CPU), so a router
        keeps no claim on pages that are gone."""
        host = self.host
        if host is None:
            return 0, 0
        dropped = len(host), host.bytes
        host.clear()
        if self.host_events is not None:
            self.host_events.removed(list(self.host_events.blocks))
        return dropped

    # ----- statistics ---------------------------------------------------------------
    def stats(self) -> dict:
        host = self.host
        return {
            "kv_spilled_pages": self.spilled,  # pinned pages that gave way, all told
            "kv_spilled_to_host_pages": self.to_host,
            "kv_spilled_to_disk_pages": self.to_disk,
            "kv_spill_dropped_pages": self.dropped,  # no tier took them: prefilled again
            "kv_restored_from_host_pages": self.from_host,
            "kv_restored_from_disk_pages": self.from_disk,
            "kv_spilled_pinned_tokens": self.cache.spilled_pages() * self.page_size,
            "kv_host_tier_pages": len(host) if host else 0,
            "kv_host_tier_bytes": host.bytes if host else 0,
            "kv_host_tier_budget_bytes": host.budget_bytes if host else 0,
        }


def open_prefix_spill(
    parts: PrefixTierParts,
    store: PrefixStore | None,
    settings: TierSettings,
    device_type: str,
    events: KVEventSink | None = None,
) -> PrefixSpill:
    """The spill tier over these parts, with the disk tier `store` (or None) behind its
    host tier, reporting KV events to `events` (or not). Its owner hooks it in: `spill`
    into the tree (RadixCache.spill), `restore` into the scheduler
    (engine/core/prefix_tiers.py)."""
    return PrefixSpill(parts, store, host_budget_bytes(settings, device_type), events)
