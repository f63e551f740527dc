"""Prefix KV across processes: save cached prefixes to the disk tier, restore them.

The bridge between a running engine (its pool, allocator and radix tree:
PrefixTierParts) and engine/kv/disk_tier.py. Pages are keyed by a chain rooted in:

- the engine fingerprint (`engine_fingerprint`, engine/kv/prefix_tier_parts.py):
  everything that decides the K/V bytes a prefill writes — the model (folder,
  config.json's hash, the weight files' names, sizes and mtimes), dtype, KV
  dtype, page size and layout, rotation, scale granularity, attention backend,
  CPU kernel, deterministic mode, device type and torch version;
- the digest of the KV scales in force (FP8 bytes mean nothing without them);
- the cache salt.

An FP8 pool whose scales are still to be calibrated from the first prefill
(the agent's local engine) adopts the saved scale set whose chain matches,
which is what that first prefill would have been quantized with had it
happened; a pool with scales in force only matches pages saved under exactly
those scales. Restored pages go into the radix tree as a prefill's would, so
the next request finds them cached. For a hybrid model a saved prefix also
carries the recurrent-state snapshot of its deepest page that has one (only
that one: a state costs as much as thousands of tokens of pages), which a
restore puts back with its page; pages restored without a state are reused
only as far as an earlier snapshot reaches (engine/kv/radix.py `match`). Pinned pages that give way under pool
pressure are written through `write` too, and read back page by page
(engine/kv/prefix_spill.py).

With KV events on, the pages this engine writes are reported stored with
medium STORAGE, under the block hashes the tree gave them, and reported
removed when this engine's budget eviction or a flush (`remove_pages`) deletes
them. Pages found on disk at start-up are not reported until written again
(what a restore brings into the tree is reported by the tree).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.kv.disk_tier import (
    DamagedPage,
    DiskTier,
    PageRecord,
    chain_keys,
    default_root,
    root_key,
    scales_digest,
)
from engine.kv.kv_event_recorder import KVEventSink, TierEvents
from engine.kv.kv_events import MEDIUM_STORAGE
from engine.kv.prefix_tier_parts import PrefixTierParts, TierSettings, engine_fingerprint

log = logging.getLogger(__name__)


def _scale_pair(pool) -> tuple[str, str]:
    """The names of the pool's two scale tensors (GQA: K and V; MLA: latent and rope)."""
    return ("k", "v") if pool.layout_kind == "gqa" else ("latent", "rope")


def scales_state(pool) -> tuple[str, dict | None]:
    """(digest, scales) in force; "none" for a cache without scales; ("", None) while
    an FP8 pool is partly calibrated (nothing can be saved or matched then)."""
    if not pool.is_fp8:
        return "none", None
    if pool.calibrated_layers != pool.layout.num_layers:
        return "", None
    scales = pool.scales()
    return scales_digest(scales), scales


@dataclass
class SaveJob:
    records: list[PageRecord]
    scales_digest: str
    scales: dict | None
    # KV events: page key -> (block hash, parent's block hash, tokens) of the records.
    blocks: dict[bytes, tuple] = field(default_factory=dict)


@dataclass
class RestorePlan:
    tokens: list[int]
    salt: str
    start: int  # pages the tree held when planned
    keys: list[str]  # the root key, then one key per page of `tokens`
    scales: dict | None  # a scale set to adopt, for a pool without scales yet
    scales_digest: str


class PrefixStore:
    def __init__(
        self,
        parts: PrefixTierParts,
        root: Path,
        budget_bytes: int,
        events: KVEventSink | None = None,
    ):
        self.parts = parts
        self.fingerprint, self.facts = engine_fingerprint(parts)
        self.tier = DiskTier(root, self.fingerprint, budget_bytes)
        self.page_size = parts.page_size
        # KV events of the pages this engine writes (medium STORAGE), keyed (depth, key).
        self.events = TierEvents(events, MEDIUM_STORAGE) if events is not None else None

    # ----- save -------------------------------------------------------------------

    def collect(self, token_ids: list[int], salt: str = "") -> SaveJob | None:
        """The cached full pages of this prefix as records to write (payloads only for
        pages not on disk yet). Runs on the engine thread; `write` can run anywhere."""
        cache = self.parts.cache
        digest, scales = scales_state(self.parts.pool)
        if not digest:
            return None
        nodes = cache.match(list(token_ids) + [0], salt, record=False).nodes
        tokens = list(token_ids[: len(nodes) * self.page_size])
        keys = chain_keys(root_key(self.fingerprint, digest, salt), tokens, self.page_size)
        parent = root_key(self.fingerprint, digest, salt)
        with_state = max((d for d, n in enumerate(nodes) if n.snapshot is not None), default=-1)
        records, blocks = [], {}
        for depth, (node, key) in enumerate(zip(nodes, keys, strict=True)):
            keeps_state = depth == with_state
            on_disk = self.tier.has_page(depth, key) and (
                not keeps_state or self.tier.has_state(depth, key)
            )
            payload = state = b""
            if not on_disk:
                payload = self.parts.pool.page_bytes(node.page)
                state = self.parts.snapshot_bytes(node) if keeps_state else b""
            records.append(PageRecord(key, parent, depth, list(node.tokens), salt, payload, state))
            if self.events is not None and node.event_block() is not None:
                blocks[key] = node.event_block()
            parent = key
        return SaveJob(records, digest, scales, blocks) if records else None

    def write(self, job: SaveJob | None) -> int:
        """Write the new pages, refresh the rest, keep the budget; returns pages written."""
        if job is None:
            return 0
        records, digest, scales = job.records, job.scales_digest, job.scales
        self.tier.write_meta(
            {k: self.facts[k] for k in ("model_dir", "kv_cache_dtype", "page_size", "dtype")}
            | {"model": Path(self.facts["model_dir"]).name}
        )
        if scales is not None:
            self.tier.put_scales(digest, scales)
        written = 0
        for record in records:
            if record.payload:
                self.tier.put_page(record)
                written += 1
        self.tier.touch([(r.depth, r.key) for r in records])
        if self.events is not None:
            for record in records:
                if record.key in job.blocks:
                    self.events.stored((record.depth, record.key), job.blocks[record.key])
        if self.tier.evict_to_budget() and self.events is not None:
            self.events.missing(lambda place: self.tier.has_page(*place))
        return written

    def save(self, token_ids: list[int], salt: str = "") -> int:
        return self.write(self.collect(token_ids, salt))

    def remove_pages(self) -> tuple[int, int]:
        """Delete this engine's page files (a cache flush); (pages, bytes) removed. With
        KV events on, every reported page now gone is reported removed (medium STORAGE)."""
        removed = self.tier.remove_pages()
        if self.events is not None:
            self.events.missing(lambda place: self.tier.has_page(*place))
        return removed

    # ----- restore ------------------------------------------------------------------
    def _candidates(self) -> list[tuple[str, dict | None]]:
        """Scale sets pages may have been saved under that this pool can use."""
        pool = self.parts.pool
        digest, scales = scales_state(pool)
        if digest:
            return [(digest, None)]  # in force: only pages saved under them
        if pool.calibrated_layers == 0:
            return self.tier.scale_sets()  # still free to adopt one
        return []

    def restore(self, token_ids: list[int], salt: str = "") -> int:
        """Load the saved pages of this prefix that the tree lacks; returns tokens loaded.

        Stops at the first missing, damaged or unplaceable page: the rest is
        prefilled as usual, never read from a file that failed its check.
        The three steps are apart so that a server can read and check the
        files off its engine thread (AsyncEngine.restore_prefix)."""
        plan = self.plan(token_ids, salt)
        return self.place(plan, self.read(plan)) if plan is not None else 0

    def plan(self, token_ids: list[int], salt: str = "") -> RestorePlan | None:
        """What to read: the pages past those the tree holds, under a usable scale set.
        Engine thread (it reads the tree); cheap."""
        tokens = list(token_ids)
        have = len(self.parts.cache.match(tokens + [0], salt, record=False).pages)
        if have >= len(tokens) // self.page_size:
            return None
        for digest, scales in self._candidates():
            root = root_key(self.fingerprint, digest, salt)
            keys = [root, *chain_keys(root, tokens, self.page_size)]
            if self.tier.has_page(have, keys[have + 1]):
                return RestorePlan(tokens, salt, have, keys, scales, digest)
        return None

    def read(self, plan: RestorePlan | None) -> list[PageRecord]:
        """The planned pages from disk, each checked, up to the first missing or damaged
        one. Any thread: it touches only files."""
        if plan is None:
            return []
        ps, records = self.page_size, []
        for depth in range(plan.start, len(plan.keys) - 1):
            chunk = plan.tokens[depth * ps : (depth + 1) * ps]
            try:
                records.append(
                    self.tier.get_page(depth, plan.keys[depth + 1], plan.keys[depth], chunk)
                )
            except FileNotFoundError:
                break
            except DamagedPage as err:
                later = self._pages_after(plan, depth)
                log.warning(
                    "saved KV page %d is damaged (%s) and was removed; the %d saved page(s) "
                    "after it in this prefix are cut off; prefilling from there",
                    depth,
                    err,
                    later,
                )
                break
            except OSError as err:  # unreadable (EIO, permissions): not trusted, not removed
                log.warning(
                    "saved KV page %d cannot be read (%s); prefilling from there", depth, err
                )
                break
        return records

    def _pages_after(self, plan: RestorePlan, depth: int) -> int:
        """How many pages of the planned chain past `depth` are on disk in a row."""
        count = 0
        for later in range(depth + 1, len(plan.keys) - 1):
            if not self.tier.has_page(later, plan.keys[later + 1]):
                break
            count += 1
        return count

    def place(self, plan: RestorePlan | None, records: list[PageRecord]) -> int:
        """Copy checked pages into the pool and the tree; returns tokens placed. Engine
        thread. The tree may have changed since `plan`: pages it gained meanwhile are
        skipped, and pages it lost leave a gap nothing may follow (then nothing is placed)."""
        if plan is None or not records:
            return 0
        pool, allocator = self.parts.pool, self.parts.allocator
        have = self.parts.cache.match(plan.tokens + [0], plan.salt, record=False).pages
        if len(have) < plan.start:
            return 0
        if plan.scales is not None and pool.calibrated_layers != 0:
            if scales_state(pool)[0] != plan.scales_digest:
                return 0  # the pool took other scales meanwhile: these bytes mean nothing
        for page in have:  # making room must not evict the prefix being extended
            allocator.retain(page)
        try:
            return self._place(plan, records, have)
        finally:
            allocator.release(have)

    def _place(self, plan: RestorePlan, records: list[PageRecord], have: list[int]) -> int:
        pool, allocator, ps = self.parts.pool, self.parts.allocator, self.page_size
        tokens, salt = plan.tokens, plan.salt
        new_pages: list[int] = []
        loaded, states = [], []
        for record in records[len(have) - plan.start :]:
            # Room from unpinned, unused cached pages only.
            if not allocator.can_allocate(1) and self.parts.cache.evict(1) < 1:
                break
            if plan.scales is not None and not new_pages and pool.calibrated_layers == 0:
                # Adopt the scale set only once a page under it has checked out.
                a, b = _scale_pair(pool)
                pool.set_scales(torch.tensor(plan.scales[a]), torch.tensor(plan.scales[b]), "disk")
            page = allocator.allocate(1)[0]
            try:
                pool.load_page_bytes(page, record.payload)
            except ValueError as err:
                allocator.release([page])
                log.warning("saved KV page %d does not fit this pool (%s)", record.depth, err)
                break
            new_pages.append(page)
            loaded.append((record.depth, record.key))
            states.append(record.state)
        if not new_pages:
            return 0
        count = len(have) + len(new_pages)
        path = self.parts.cache.insert(tokens[: count * ps], list(have) + new_pages, salt)
        allocator.release(new_pages)  # the tree holds them now
        for node, state in zip(path[len(have) :], states, strict=True):
            self.parts.keep_snapshot(node, state)
        self.tier.touch(loaded)
        log.info("restored %d KV pages (%d tokens) from disk", len(new_pages), len(new_pages) * ps)
        return len(new_pages) * ps

    def restore_saved(self, max_fraction: float = 0.5) -> int:
        """Restore saved prefixes, most recently used first, while they take at most
        `max_fraction` of the pool (a server starting); returns tokens restored."""
        allocator, total = self.parts.allocator, 0
        floor = allocator.num_pages * (1 - max_fraction)
        for tokens, salt in self.saved_prefixes():
            if allocator.num_free - len(tokens) // self.page_size < floor:
                continue
            total += self.restore(tokens, salt)
        return total

    def cached_prefixes(self) -> list[tuple[list[int], str]]:
        """The prefixes the tree holds worth saving when a server stops: pinned ones
        first, then the most recently used, as many as the disk budget holds."""
        pool = self.parts.pool
        per_page = len(pool.page_bytes(0)) if pool.num_pages else 0
        room = self.tier.budget_bytes // max(per_page, 1)
        out = []
        for salt, tokens, _, _ in self.parts.cache.paths():
            pages = len(tokens) // self.page_size
            if pages > room:
                break
            room -= pages
            out.append((tokens, salt))
        return out

    def saved_prefixes(self) -> list[tuple[list[int], str]]:
        """The token sequences (and salts) of saved chains ending in a leaf, most
        recently used first (what `resident serve` restores on start); every page is
        read and checked whole first, and what is damaged is removed and reported."""
        return self.tier.saved_chains()


def open_prefix_store(
    parts: PrefixTierParts,
    settings: TierSettings,
    tensor_parallel: bool,
    events: KVEventSink | None = None,
) -> PrefixStore | None:
    """The disk tier for an engine whose settings ask for one (kv_disk), else None; it
    reports the pages it writes to `events` (or not)."""
    if not settings.kv_disk:
        return None
    if tensor_parallel:
        log.info(
            "the prefix disk tier (kv_disk) is off with tensor parallelism: each rank "
            "holds its own shard of every page, and would need its own files"
        )
        return None

    root = Path(settings.kv_disk_dir) if settings.kv_disk_dir else default_root()
    store = PrefixStore(parts, root, int(settings.kv_disk_gib * 1024**3), events)
    store.tier.recover()  # what a process killed mid-save, or a full disk, left behind
    return store
