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
depth, tokens, salt, payload size), the payload (the pool's bytes for that
page across all layers) and a blake2b-256 of everything before it: a
truncated or flipped file fails the check and is deleted, and the caller
prefills instead. Files are written to a temporary name and renamed, so a
reader never sees half a page. Recency is the file's mtime; a chain is
touched with one timestamp, and eviction takes the oldest first and, among
equals, the deepest, so a prefix loses its tail before its head.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"RKVPAGE1"
SUFFIX = ".kvp"
DIGEST = 32


def default_root() -> Path:
    """RESIDENT_CACHE_DIR/kv, else the user cache dir's resident/kv."""
    override = os.environ.get("RESIDENT_CACHE_DIR")
    if override:
        return Path(override) / "kv"
    import platformdirs

    return Path(platformdirs.user_cache_dir("resident")) / "kv"


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


def encode_page(record: PageRecord) -> bytes:
    header = json.dumps(
        {
            "key": record.key.hex(),
            "parent": record.parent.hex(),
            "depth": record.depth,
            "tokens": record.tokens,
            "salt": record.salt,
            "payload_bytes": len(record.payload),
        }
    ).encode()
    body = MAGIC + struct.pack("<I", len(header)) + header + record.payload
    return body + hashlib.blake2b(body, digest_size=DIGEST).digest()


def decode_page(data: bytes, header_only: bool = False) -> PageRecord:
    """The record in a page file; raises DamagedPage unless every byte checks out."""
    if len(data) < len(MAGIC) + 4 + DIGEST or not data.startswith(MAGIC):
        raise DamagedPage("not a page file (short or wrong magic)")
    (size,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    if not header_only:
        body, digest = data[:-DIGEST], data[-DIGEST:]
        if hashlib.blake2b(body, digest_size=DIGEST).digest() != digest:
            raise DamagedPage("checksum mismatch (truncated or altered)")
    try:
        header = json.loads(data[start : start + size])
    except ValueError as err:
        raise DamagedPage(f"unreadable header: {err}") from err
    payload = b"" if header_only else data[start + size : -DIGEST]
    if not header_only and len(payload) != header["payload_bytes"]:
        raise DamagedPage("payload size differs from the header")
    return PageRecord(
        key=bytes.fromhex(header["key"]),
        parent=bytes.fromhex(header["parent"]),
        depth=int(header["depth"]),
        tokens=list(header["tokens"]),
        salt=header["salt"],
        payload=payload,
    )


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


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
            _write_atomic(path, json.dumps(meta, indent=1).encode())

    def put_scales(self, digest: str, scales: dict) -> None:
        path = self.dir / "scales" / f"{digest}.json"
        if not path.is_file():
            _write_atomic(path, json.dumps(scales).encode())
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

    def put_page(self, record: PageRecord) -> None:
        _write_atomic(self.page_path(record.depth, record.key), encode_page(record))

    def get_page(self, depth: int, key: bytes, parent: bytes, tokens: list[int]) -> PageRecord:
        """The page at this place in the chain, checked; a damaged file is deleted.

        Raises FileNotFoundError when there is none, DamagedPage when it fails a check.
        """
        path = self.page_path(depth, key)
        data = path.read_bytes()
        try:
            record = decode_page(data)
            if (record.key, record.parent, record.depth, record.tokens) != (
                key,
                parent,
                depth,
                tokens,
            ):
                raise DamagedPage("the file belongs to another place in the chain")
            if chain_keys(parent, tokens, len(tokens)) != [key]:
                raise DamagedPage("the key does not follow from its parent and tokens")
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

    def page_headers(self) -> list[tuple[int, PageRecord]]:
        """(mtime, header) of every readable page of this group, payloads left out."""
        folder = self.dir / "pages"
        out = []
        for path in folder.glob(f"*{SUFFIX}") if folder.is_dir() else []:
            try:
                with path.open("rb") as f:
                    head = f.read(len(MAGIC) + 4)
                    (size,) = struct.unpack_from("<I", head, len(MAGIC))
                    data = head + f.read(size) + b"\0" * DIGEST
                out.append((path.stat().st_mtime_ns, decode_page(data, header_only=True)))
            except (OSError, struct.error, DamagedPage, KeyError):
                continue
        return out

    # ----- the budget -------------------------------------------------------------
    def evict_to_budget(self) -> int:
        """Delete least recently used pages (of every group under the root) until the
        files fit the budget; returns the number deleted."""
        return evict(self.root, self.budget_bytes)


def _page_files(root: Path) -> list[tuple[int, int, int, Path]]:
    """(mtime, -depth, size, path) of every page file under `root`."""
    files = []
    for path in root.glob(f"*/pages/*{SUFFIX}") if root.is_dir() else []:
        try:
            st = path.stat()
            depth = int(path.name.split("-", 1)[0])
        except (OSError, ValueError):
            continue
        files.append((st.st_mtime_ns, -depth, st.st_size, path))
    return files


def evict(root: Path, budget_bytes: int) -> int:
    files = sorted(_page_files(root))
    total = sum(size for _, _, size, _ in files)
    removed = 0
    for _, _, size, path in files:
        if total <= budget_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed += 1
    return removed


def summary(root: Path) -> list[dict]:
    """One entry per engine fingerprint: what it is, its pages, bytes and last use."""
    out = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if not folder.is_dir():
            continue
        files = _page_files_of(folder)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        out.append(
            {
                "engine": folder.name,
                "model": meta.get("model", "?"),
                "kv_cache_dtype": meta.get("kv_cache_dtype", "?"),
                "page_size": meta.get("page_size"),
                "pages": len(files),
                "bytes": sum(size for _, size in files),
                "last_used": max((mtime for mtime, _ in files), default=0) / 1e9,
            }
        )
    return out


def _page_files_of(folder: Path) -> list[tuple[int, int]]:
    out = []
    for path in (folder / "pages").glob(f"*{SUFFIX}"):
        try:
            st = path.stat()
        except OSError:
            continue
        out.append((st.st_mtime_ns, st.st_size))
    return out


def clear(root: Path) -> int:
    """Delete every saved page and scale set; returns the bytes freed."""
    freed = sum(size for *_, size, _ in _page_files(root))
    if root.is_dir():
        shutil.rmtree(root)
    return freed
