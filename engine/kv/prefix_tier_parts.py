"""What the prefix tiers (prefix_store.py to disk, prefix_spill.py to host memory)
use of the engine they serve, and nothing more: its pool, page allocator and
radix tree, the facts that fingerprint its K/V bytes, and the settings they read;
for a hybrid model, the snapshot pool whose entries hold the recurrent state at
some pages' ends (engine/kv/prefix_snapshots.py): a page carries its node's
snapshot out to a tier and back, or comes back without one (and is then reused
only as far as an earlier snapshot reaches, engine/kv/radix.py `match`).

The engine's set-up (engine/core/prefix_tiers.py) builds these parts and wires
the tiers' hooks into the tree and the scheduler itself; the tiers never reach
back into the engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import torch

from engine.kv.pages import PageAllocator
from engine.kv.pool_base import PagedPoolBase
from engine.kv.radix import RadixCache, RadixNode
from engine.kv.sizing import KVLayout
from engine.kv.state_pool import RecurrentStatePool

log = logging.getLogger(__name__)

FORMAT = 1
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")


class TierSettings(Protocol):
    """The settings the tiers read (EngineConfig's fields; kv cannot import the config,
    which reads kv's dtypes)."""

    @property
    def kv_disk(self) -> bool: ...
    @property
    def kv_disk_dir(self) -> str | None: ...
    @property
    def kv_disk_gib(self) -> float: ...
    @property
    def kv_host_gib(self) -> float | None: ...
    @property
    def tensor_parallel_size(self) -> int: ...


@dataclass(frozen=True)
class FingerprintFacts:
    """Everything besides the pool's scales that decides the K/V bytes a prefill
    writes: a saved page is only used by an engine with the same facts."""

    model_dir: Path
    architecture: str
    dtype: torch.dtype
    kv_cache_dtype: str
    page_size: int
    layout: KVLayout
    kv_rotation: str
    kv_rotation_detail: str
    attention_backend: str
    cpu_kernel: str
    cpu_weights: str  # weights rounded at load compute another function than the checkpoint's
    deterministic: bool
    device_type: str


class PrefixTierParts:
    """The pool, allocator and tree the tiers copy pages between, and the facts."""

    def __init__(
        self,
        pool: PagedPoolBase,
        allocator: PageAllocator,
        cache: RadixCache,
        facts: FingerprintFacts,
        states: RecurrentStatePool | None = None,
    ):
        self.pool = pool
        self.states = states  # the snapshot pool of a hybrid model, else None
        self.allocator = allocator
        # The tree weakly: its `spill` hook is a method of the spill tier, which holds
        # these parts; a cycle would keep a dropped engine's KV pool alive until the
        # cycle collector happened to run, gigabytes at a time in a test suite.
        self._cache = weakref.ref(cache)
        self.facts = facts

    @property
    def cache(self) -> RadixCache:
        cache = self._cache()
        if cache is None:
            raise RuntimeError("the engine that held this prefix cache is gone")
        return cache

    @property
    def page_size(self) -> int:
        return self.facts.page_size

    def snapshot_bytes(self, node: RadixNode) -> bytes:
        """The recurrent state kept at this node's page end, or b"" (none kept)."""
        if self.states is None or node.snapshot is None:
            return b""
        return self.states.slot_bytes(node.snapshot)

    def keep_snapshot(self, node: RadixNode, data: bytes) -> None:
        """Give a restored page's node its state back (a node in the tree). Without an
        entry to be had, it stays without one: only reuse past it is lost."""
        snapshots = self.cache.snapshots
        if not data or self.states is None or snapshots is None or node.snapshot is not None:
            return
        entry = snapshots.take()
        if entry is None:
            return
        try:
            self.states.load_slot_bytes(entry, data)
        except ValueError as err:
            snapshots.give_back(entry)
            log.warning("a restored recurrent state does not fit this engine (%s)", err)
            return
        snapshots.attach(node, entry)


def _model_identity(model_dir: Path) -> dict:
    config = model_dir / "config.json"
    files = sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        for p in model_dir.iterdir()
        if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)
    )
    return {
        "model_dir": str(model_dir.resolve()),
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest()
        if config.is_file()
        else "",
        "weights": files,
    }


def engine_fingerprint(parts: PrefixTierParts) -> tuple[str, dict]:
    """(fingerprint, the facts it covers): the model (folder, config.json's hash, the
    weight files' names, sizes and mtimes) and every fact above, the pool's scale
    granularity (as it is now) and torch's version."""
    return fingerprint_of(parts.facts, parts.pool.granularity)


def fingerprint_of(facts: FingerprintFacts, scale_granularity: str) -> tuple[str, dict]:
    """engine_fingerprint from the facts themselves (for what keys on the same facts
    without the tiers, such as the cached start-up KV scales)."""
    covered = {
        "format": FORMAT,
        **_model_identity(Path(facts.model_dir)),
        "architecture": facts.architecture,
        "dtype": str(facts.dtype),
        "kv_cache_dtype": facts.kv_cache_dtype,
        "page_size": facts.page_size,
        "layout": {k: str(v) for k, v in asdict(facts.layout).items()},
        "kv_rotation": facts.kv_rotation,
        "kv_rotation_detail": facts.kv_rotation_detail,
        "scale_granularity": scale_granularity,
        "attention_backend": facts.attention_backend,
        "cpu_kernel": facts.cpu_kernel,
        "cpu_weights": facts.cpu_weights,
        "deterministic": facts.deterministic,
        "device": facts.device_type,
        "torch": torch.__version__,
    }
    digest = hashlib.sha256(json.dumps(covered, sort_keys=True).encode()).hexdigest()[:32]
    return digest, covered
