"""The disk tier of the prefix cache: KV pages in files, checksummed, bounded, LRU out.

One file per page, named by its place in a hash chain: the key of page i is
blake2b(key of page i-1, its tokens), and page 0's parent is a root key made
from the engine fingerprint, the KV scales and the cache salt. So a key names
a whole token prefix under one engine state; a different model, dtype, scale,
rotation, salt or any earlier token gives a different key and never matches.
One file per page (not per prefix) because prefixes share their leading pages
(system prompt, the unchanged start of a repository snapshot), a damaged or
evicted page costs only the pages after it, and LRU by page mirrors the
radix tree in memory. The host tier (engine/kv/host_tier.py) keys spilled
pages the same way; pinned pages that give way under pool pressure land here
when it is off or full (engine/kv/prefix_spill.py).

Layout under the root (platformdirs' user cache dir + /kv, or RESIDENT_CACHE_DIR):

    <engine>/meta.json               what the engine fingerprint stands for (listing)
    <engine>/scales/<digest>.json    KV scale sets pages were written under
    <engine>/pages/<depth>-<key>.kvp one page

A page file is MAGIC, a 4-byte header length, a JSON header (key, parent,
depth, tokens, salt, payload size, state size), the payload (the pool's bytes
for that page across all layers), for a hybrid model the recurrent-state
snapshot kept at the page's end if any (engine/kv/prefix_snapshots.py; absent
from files written before states were kept: size 0), and a blake2b-256 of everything before it: a
truncated or flipped file fails the check and is deleted, and the caller
prefills instead. Nothing is trusted by its header alone: a read checks the
whole file, and the scan a starting server makes (`saved_chains`) does too,
removing and reporting damaged files and the pages their loss cuts off.
Files are written to a temporary name and renamed, so a reader never sees
half a page; engine/kv/disk_files.py removes the temporaries a crash or a
full disk leaves, and keeps every byte under the root within the budget.
Recency is the file's mtime; a chain is touched with one timestamp, and
eviction takes the oldest first and, among equals, the deepest, so a prefix
loses its tail before its head.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from engine.host.cache_root import cache_root
from engine.kv.disk_files import SUFFIX, evict, page_depth, remove_stale_temporaries, write_atomic

log = logging.getLogger(__name__)
MAGIC = b"RKVPAGE1"
DIGEST = 32


def default_root() -> Path:
    """RESIDENT_CACHE_DIR/kv, else the user cache dir's resident/kv."""
    return cache_root() / "kv"


def _hash(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.digest()


def root_key(fingerprint: str, scales_digest: str, salt: str) -> bytes:
    return _hash(b"resident-kv", fingerprint.encode(), scales_digest.encode(), salt.encode())


def page_key(parent: bytes, tokens) -> bytes:
    """The key of one page from its parent's key (or the root key) and its tokens."""
    return _hash(parent, struct.pack(f"<{len(tokens)}q", *tokens))


def chain_keys(root: bytes, tokens: list[int], page_size: int) -> list[bytes]:
    """The key of every full page of `tokens`, each covering all the pages before it."""
    keys, key = [], root
    for i in range(len(tokens) // page_size):
        key = page_key(key, tokens[i * page_size : (i + 1) * page_size])
        keys.append(key)
    return keys


def scales_digest(scales: dict) -> str:
    """The name of a scale set: float32 values go through Python floats and JSON exactly."""
    return hashlib.sha256(json.dumps(scales, sort_keys=True).encode()).hexdigest()[:32]


class DamagedPage(ValueError):
    """A page file that fails its checksum or says something other than asked."""


@dataclass
class PageRecord:
    key: bytes
    parent: bytes
    depth: int
    tokens: list[int]
    salt: str
    payload: bytes
    state: bytes = b""  # a hybrid model's recurrent state at the page's end, if kept


def encode_page(record: PageRecord) -> bytes:
    header = json.dumps(
        {
            "key": record.key.hex(),
            "parent": record.parent.hex(),
            "depth": record.depth,
            "tokens": record.tokens,
            "salt": record.salt,
            "payload_bytes": len(record.payload),
            # Only where there is a state: files of models without one stay as they were.
            **({"state_bytes": len(record.state)} if record.state else {}),
        }
    ).encode()
    body = MAGIC + struct.pack("<I", len(header)) + header + record.payload + record.state
    return body + hashlib.blake2b(body, digest_size=DIGEST).digest()


def decode_page(data: bytes) -> PageRecord:
    """The record in a page file; raises DamagedPage unless every byte checks out: the
    magic, the checksum over everything before it, a readable header, and a payload
    exactly as long as the header says."""
    if len(data) < len(MAGIC) + 4 + DIGEST or not data.startswith(MAGIC):
        raise DamagedPage("not a page file (short or wrong magic)")
    body, digest = data[:-DIGEST], data[-DIGEST:]
    if hashlib.blake2b(body, digest_size=DIGEST).digest() != digest:
        raise DamagedPage("checksum mismatch (truncated or altered)")
    (size,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    rest = data[start + size : -DIGEST]
    try:
        header = json.loads(data[start : start + size])
        declared = int(header["payload_bytes"])
        state_size = int(header.get("state_bytes", 0))
        record = PageRecord(
            key=bytes.fromhex(header["key"]),
            parent=bytes.fromhex(header["parent"]),
            depth=int(header["depth"]),
            tokens=[int(t) for t in header["tokens"]],
            salt=str(header["salt"]),
            payload=rest[:declared],
            state=rest[declared:],
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:  # checksummed, other shape
        raise DamagedPage(f"unreadable header: {err!r}") from err
    if declared < 0 or state_size < 0 or len(rest) != declared + state_size:
        raise DamagedPage("payload size differs from the header")
    return record


def stored_state_bytes(path: Path) -> int:
    """The state size a page file's header declares, read without the rest of the file
    (whether a saved page already carries its snapshot); 0 when unreadable."""
    try:
        with path.open("rb") as file:
            head = file.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or not head.startswith(MAGIC):
                return 0
            (size,) = struct.unpack_from("<I", head, len(MAGIC))
            return int(json.loads(file.read(size)).get("state_bytes", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


class DiskTier:
    """Page files for one engine fingerprint (`group`), under a root shared by all."""

    def __init__(self, root: Path, group: str, budget_bytes: int):
        self.root = Path(root)
        self.group = group
        self.budget_bytes = int(budget_bytes)
        self.dir = self.root / group

    # ----- engine description and scale sets ------------------------------------
    def write_meta(self, meta: dict) -> None:
        path = self.dir / "meta.json"
        if not path.is_file():
            write_atomic(path, json.dumps(meta, indent=1).encode())

    def put_scales(self, digest: str, scales: dict) -> None:
        path = self.dir / "scales" / f"{digest}.json"
        if not path.is_file():
            write_atomic(path, json.dumps(scales).encode())
        os.utime(path)

    def scale_sets(self) -> list[tuple[str, dict]]:
        """Saved scale sets, most recently used first; unreadable ones are skipped."""
        folder = self.dir / "scales"
        if not folder.is_dir():
            return []
        found = []
        for path in folder.glob("*.json"):
            try:
                scales = json.loads(path.read_text())
                mtime = path.stat().st_mtime_ns
            except (OSError, ValueError):
                continue
            if scales_digest(scales) == path.stem:  # the name is its checksum
                found.append((mtime, path.stem, scales))
        return [(digest, scales) for _, digest, scales in sorted(found, reverse=True)]

    # ----- pages ----------------------------------------------------------------
    def page_path(self, depth: int, key: bytes) -> Path:
        return self.dir / "pages" / f"{depth:06d}-{key.hex()}{SUFFIX}"

    def has_page(self, depth: int, key: bytes) -> bool:
        return self.page_path(depth, key).is_file()

    def has_state(self, depth: int, key: bytes) -> bool:
        """The saved page carries a recurrent-state snapshot (hybrid models)."""
        return stored_state_bytes(self.page_path(depth, key)) > 0

    def put_page(self, record: PageRecord) -> None:
        write_atomic(self.page_path(record.depth, record.key), encode_page(record))

    def get_page(self, depth: int, key: bytes, parent: bytes, tokens: list[int]) -> PageRecord:
        """The page at this place in the chain, checked; a damaged file is deleted.

        Raises FileNotFoundError when there is none, DamagedPage when it fails a check.
        """
        path = self.page_path(depth, key)
        data = path.read_bytes()
        try:
            record = decode_page(data)
            _check_place(record, depth, key, parent, tokens)
        except DamagedPage:
            path.unlink(missing_ok=True)
            raise
        return record

    def touch(self, pages: list[tuple[int, bytes]]) -> None:
        """Mark pages used now, all with one time (so depth breaks the LRU tie)."""
        now = time.time_ns()
        for depth, key in pages:
            try:
                os.utime(self.page_path(depth, key), ns=(now, now))
            except FileNotFoundError:
                pass

    def recover(self) -> tuple[int, int]:
        """When a tier opens: remove the temporaries that crashed or failed writes left
        under the root (every engine's: they share the budget), say so, and meet the
        budget. Returns (files removed, bytes freed)."""
        count, freed = remove_stale_temporaries(self.root)
        if count:
            log.warning(
                "KV disk tier %s: removed %d temporary file(s), %d bytes, left by "
                "interrupted or failed writes",
                self.root,
                count,
                freed,
            )
        try:
            self.evict_to_budget()
        except OSError as err:  # a read-only or vanished cache: reads may still work
            log.warning("KV disk tier %s: could not meet its budget: %s", self.root, err)
        return count, freed

    def verified_pages(self) -> tuple[list[tuple[int, PageRecord]], set[bytes]]:
        """Every page file of this engine read and checked whole (length, checksum, its
        place in the chain agreeing with its name): ([(mtime, record without payload)],
        keys of the damaged files, which are removed and reported in one line)."""
        folder = self.dir / "pages"
        good, damaged, reasons = [], set(), set()
        count = damaged_bytes = 0
        for path in sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []:
            try:
                mtime = path.stat().st_mtime_ns
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # evicted or found damaged by another process meanwhile
            except OSError as err:  # unreadable now is not damaged: left, never trusted
                log.warning("KV disk tier: cannot read %s: %s", path, err)
                continue
            place = _name_place(path)
            try:
                record = decode_page(data)
                if place is None:
                    raise DamagedPage("not named for a place in a chain")
                _check_place(record, *place, record.parent, record.tokens)
            except DamagedPage as err:
                path.unlink(missing_ok=True)
                damaged.add(place[1] if place else b"")
                count, damaged_bytes = count + 1, damaged_bytes + len(data)
                reasons.add(str(err))
                continue
            record.payload = record.state = b""  # headers only; a restore reads again
            good.append((mtime, record))
        if count:
            log.warning(
                "KV disk tier %s: removed %d damaged page file(s), %d bytes (%s)",
                self.dir,
                count,
                damaged_bytes,
                "; ".join(sorted(reasons)),
            )
        return good, damaged

    def saved_chains(self) -> list[tuple[list[int], str]]:
        """The token sequences (and salts) of whole saved chains ending in a leaf, most
        recently used first (what `resident serve` restores on start). Pages that follow
        a missing page cannot be restored; those cut off by a damaged page just removed
        are reported as such."""
        headers, damaged = self.verified_pages()
        by_key = {record.key: record for _, record in headers}
        parents = {record.parent for _, record in headers}
        leaves = sorted(
            ((mtime, r) for mtime, r in headers if r.key not in parents),
            key=lambda item: (-item[0], -item[1].depth),
        )
        out, whole = [], set()
        for _, leaf in leaves:
            chain, record = [], leaf
            while record is not None and len(chain) <= leaf.depth:  # depth bounds a chain
                chain.append(record)
                record = by_key.get(record.parent)
            chain.reverse()
            if chain[0].depth != 0 or len(chain) != leaf.depth + 1:
                continue  # a page missing further up: counted below
            whole.update(r.key for r in chain)
            out.append(([t for r in chain for t in r.tokens], leaf.salt))
        _report_cut_off([r for _, r in headers if r.key not in whole], by_key, damaged)
        return out

    # ----- the budget -------------------------------------------------------------
    def evict_to_budget(self) -> int:
        """Delete stale temporaries and least recently used pages (of every group under
        the root) until every file there fits the budget; returns the pages deleted."""
        return evict(self.root, self.budget_bytes)

    def remove_pages(self) -> tuple[int, int]:
        """Delete every page file of this engine (a cache flush); (pages, bytes) removed.
        Scale sets and the meta file stay: they are small and name no prefix. Other
        engines' pages under the same root are left alone."""
        folder, count, freed = self.dir / "pages", 0, 0
        for path in folder.glob(f"*{SUFFIX}") if folder.is_dir() else []:
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:  # removed by another process meanwhile, or a read-only cache
                continue
            count, freed = count + 1, freed + size
        return count, freed


def _check_place(record: PageRecord, depth: int, key: bytes, parent: bytes, tokens) -> None:
    """The record is the page at (depth, key) under `parent` holding `tokens`."""
    if (record.key, record.parent, record.depth, record.tokens) != (key, parent, depth, tokens):
        raise DamagedPage("the file belongs to another place in the chain")
    if page_key(parent, tokens) != key:
        raise DamagedPage("the key does not follow from its parent and tokens")


def _name_place(path: Path) -> tuple[int, bytes] | None:
    """(depth, key) from a page file's name, `<depth>-<key hex>.kvp`."""
    depth = page_depth(path)
    try:
        key = bytes.fromhex(path.name[: -len(SUFFIX)].split("-", 1)[1])
    except (IndexError, ValueError):
        return None
    return (depth, key) if depth is not None else None


def _report_cut_off(orphans: list[PageRecord], by_key: dict, damaged: set[bytes]) -> None:
    """Say how many saved pages cannot be restored because a page before them is gone:
    a warning for those a damaged page cut off, a note for the rest (evicted parents,
    or the tail of a pinned prefix spilled while its head stayed in memory)."""
    cut, other = 0, 0
    for record in orphans:
        top, steps = record, 0
        while top.parent in by_key and steps < len(by_key):
            top, steps = by_key[top.parent], steps + 1
        if top.parent in damaged:
            cut += 1
        else:
            other += 1
    if cut:
        log.warning(
            "KV disk tier: %d saved page(s) followed a damaged one and are not restored; "
            "their prefixes restore up to the damage and prefill the rest",
            cut,
        )
    if other:
        log.info("KV disk tier: %d saved page(s) follow a page not on disk; not restored", other)
