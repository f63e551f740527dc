"""KV events: the blocks the prefix cache stores, removes and clears, as vLLM publishes them.

Routers that place a request on the replica holding its prefix (vllm-router's
`kv_aware` policy, llm-d's KV-cache-aware scheduler) subscribe to each worker's
KV-event stream. Resident speaks vLLM's stream exactly, so they need not know
which engine they listen to. Here: the messages, the block hashes and the
`--kv-events` setting; engine/kv/kv_event_recorder.py gathers the events the
prefix cache and its tiers report, engine/kv/kv_event_publisher.py sends them
over ZMQ.

The wire format (vLLM, vllm/distributed/kv_events.py, read at commits 0181ea3
and b4e69e0 of github.com/vllm-project/vllm; the consumer side read in
vllm-router 0.1.17's sources, the sdist on PyPI: src/kv_index/wire.rs,
decode.rs, subscriber.rs):

- One ZMQ PUB message per batch, three frames: the topic (UTF-8, default ""),
  the sequence number (8 bytes, big-endian, from 0, +1 per batch), the payload.
  vllm-router's subscriber reads the sequence as a signed big-endian i64,
  requires exactly 3 frames and a topic frame equal to its topic (static
  sources: ""), and treats a jump in the sequence as lost events.
- The payload is msgpack (msgspec) of `KVEventBatch`, an `array_like` struct:
  `[ts, events, data_parallel_rank]` (ts a float of seconds since the epoch;
  every position is kept, a rank of None is nil: msgspec's omit_defaults leaves
  nothing out of an array_like struct). The publisher gives rank 0, as vLLM's
  does for its only rank. vllm-router accepts 2 or 3 elements (a nil rank is
  none), at most 4096 events and 16 MiB per payload.
- Each event is a *tagged map* (`tag=True`, not array_like): `{"type":
  "BlockStored", ...}` with the struct's fields by name, fields without a
  default always present (None as nil), fields at their default left out:
  - BlockStored: block_hashes, parent_block_hash, token_ids, block_size,
    lora_id, medium, lora_name; then extra_keys, group_idx, kv_cache_spec_kind,
    kv_cache_spec_sliding_window (default None, so absent here). One event is
    one chain: block i's parent is block i-1, the first block's parent is
    `parent_block_hash` (None at the root); token_ids are the blocks' tokens,
    len(block_hashes) * block_size of them (vLLM's block_pool.cache_full_blocks).
  - BlockRemoved: block_hashes, medium (then group_idx; absent).
  - AllBlocksCleared: no fields (vLLM: reset_prefix_cache).
  vllm-router 0.1.17 rejects a batch with any other field name, so none is added
  (newer vLLM's event_version, locality and ownership sit at their defaults,
  so vLLM leaves them out too).
- `medium`: "GPU" for the engine's own KV pool (vLLM's block pool always says
  MEDIUM_GPU, CPU backend included), "CPU" for host memory, "STORAGE" for disk
  (MEDIUM_GPU/MEDIUM_CPU/MEDIUM_STORAGE). vllm-router maps them to its device,
  host and disk tiers and credits a host or disk hit at 0.8 and 0.3 of a device one.
- Block hashes (ExternalBlockHash = bytes | int): vLLM's `sha256_cbor` chain
  (vllm/v1/core/kv_cache_utils.py hash_block_tokens, vllm/utils/hashing.py):
  hash_i = sha256(cbor2.dumps((hash_{i-1}, tuple(tokens_i), extra_keys_i),
  canonical=True)), with hash_{-1} = NONE_HASH = sha256_cbor(seed) for the
  seed string PYTHONHASHSEED (Resident: `hash_seed`, default the environment's
  PYTHONHASHSEED, else "0", so every replica hashes alike); extra_keys is
  `(cache_salt,)` on a salted prefix's first block, else None. On the wire the
  hash is the low 64 bits as an unsigned int (`int.from_bytes(h, "big") &
  (2**64 - 1)`, vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), or the
  32 bytes with `"int_block_hashes": false`. So a consumer can compute every
  hash from token ids; vllm-router 0.1.17 does not even need to: it hashes
  each block's token_ids itself (sha256 of the little-endian u32 ids, per block)
  and uses the engine's hashes only to chain parents and find removed blocks.
- A replay socket (optional, `replay_endpoint`): a ROUTER that answers a
  request `[start_seq]` (8 bytes big-endian) with every buffered batch from
  there on, `[topic, seq, payload]` each, then `["", -1 (8 bytes, signed),
  ""]` (vLLM since it added the topic frame; vllm-router's DEALER expects
  exactly that). The last `buffer_steps` batches are kept.

How vllm-router 0.1.17 uses them (src/kv_index/discovery.rs, subscriber.rs,
indexer.rs; src/backend/preprocess.rs; src/policies/kv_aware.rs): one SUB
socket per worker, on the endpoint `--kv-event-source WORKER_URL=tcp://HOST:PORT`
names (with `--kv-event-block-size`, `--kv-event-model`; optional
`--kv-event-replay-source`), or, without it, found through the worker's GET
/get_server_info (kv_block_size) and GET /kv_event_sources (per rank: endpoint,
replay_endpoint, topic, publisher "zmq", encoding "msgpack", schema_version 1).
A BlockStored whose parent it never saw is skipped, so a router that starts
after a worker learns that worker's earlier blocks only through replay. For a
request it needs the prompt's token ids: a completion's token-id prompt as
given; for text or chat it asks the worker (POST /v1/completions/render or
/v1/chat/completions/render, then /tokenize) and without an answer gives no
prefix credit. It scores each worker by the longest run of the prompt's full
blocks it holds (device blocks, then one host or disk continuation at 0.8 or
0.3), times its load, and picks the cheapest.

The setting (`--kv-events`, EngineConfig.kv_events) takes vLLM's
`--kv-events-config` JSON (KVEventsConfig: enable_kv_cache_events, publisher
"zmq"|"null", endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size,
topic; plus Resident's hash_seed and int_block_hashes) or a bare endpoint
such as tcp://*:5557. As in vLLM a wildcard host (`*`, 0.0.0.0, ::), ipc:// or
inproc:// binds; unlike vLLM a loopback host binds too (vLLM would connect,
leaving nothing listening); any other host is a broker to connect to. In
JSON, a missing enable_kv_cache_events counts as true: giving the flag is
asking for events.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"
DEFAULT_ENDPOINT = "tcp://*:5557"
INT_HASH_MASK = (1 << 64) - 1

# ----- the messages (vllm/distributed/kv_events.py) ---------------------------------------


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the KV cache events (tagged by class name under "type")."""


ExternalBlockHash = bytes | int


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def encode_batch(batch: KVEventBatch) -> bytes:
    return msgspec.msgpack.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    return msgspec.msgpack.decode(payload, type=KVEventBatch)


# ----- block hashes: vLLM's sha256_cbor chain ----------------------------------------------


def _cbor_head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    for info, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if value < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | info]) + struct.pack(fmt, value)
    raise ValueError(f"{value} does not fit CBOR's 64-bit integers")


def cbor(value: Any) -> bytes:
    """Canonical CBOR (RFC 8949 §4.2.1, cbor2's canonical=True) of the values block
    hashes are made of: None, ints, str, bytes and tuples/lists of them."""
    if value is None:
        return b"\xf6"
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return _cbor_head(0, value) if value >= 0 else _cbor_head(1, -1 - value)
    if isinstance(value, bytes):
        return _cbor_head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode()
        return _cbor_head(3, len(data)) + data
    if isinstance(value, tuple | list):
        return _cbor_head(4, len(value)) + b"".join(cbor(item) for item in value)
    raise TypeError(f"no canonical CBOR here for {type(value).__name__}")


def sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor(value)).digest()


class BlockHasher:
    """vLLM's block hashes: each covers its tokens, the cache salt and every block before."""

    def __init__(self, seed: str = "0"):
        self.none_hash = sha256_cbor(seed)  # vLLM's NONE_HASH under PYTHONHASHSEED=seed

    def block(self, parent: bytes | None, tokens: Sequence[int], salt: str = "") -> bytes:
        """One block's hash; `salt` counts on the first block only (parent None)."""
        extra = (salt,) if salt and parent is None else None
        return sha256_cbor((parent or self.none_hash, tuple(tokens), extra))

    def chain(self, tokens: Sequence[int], block_size: int, salt: str = "") -> list[bytes]:
        """The hash of every full block of `tokens`."""
        out, parent = [], None
        for i in range(len(tokens) // block_size):
            parent = self.block(parent, tokens[i * block_size : (i + 1) * block_size], salt)
            out.append(parent)
        return out


def external_hash(block_hash: bytes, as_int: bool) -> ExternalBlockHash:
    """The hash as published: the low 64 bits as an int (vLLM's default), or the bytes."""
    return int.from_bytes(block_hash, "big") & INT_HASH_MASK if as_int else block_hash


# ----- the setting ------------------------------------------------------------------------


@dataclass(frozen=True)
class KVEventsSettings:
    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    hash_seed: str | None = None  # None: PYTHONHASHSEED, else "0"
    int_block_hashes: bool = True

    def event_sources(self) -> dict[str, dict[str, Any]]:
        """What GET /kv_event_sources answers for vllm-router's discovery of a worker
        without `--kv-event-source` (src/kv_index/discovery.rs KvEventSourceEntry): one
        entry per data-parallel rank, "0" here. A bind address (tcp://*:5557) is given
        as is: the router puts the worker's host in place of the wildcard."""
        entry = {
            "endpoint": self.endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": self.topic,
            "hwm": self.hwm,
            "buffer_steps": self.buffer_steps,
            "publisher": "zmq",
            "encoding": "msgpack",
            "schema_version": 1,
            "enable_kv_cache_events": True,
        }
        return {"0": entry}

    @property
    def seed(self) -> str:
        return (
            self.hash_seed if self.hash_seed is not None else os.environ.get("PYTHONHASHSEED", "0")
        )


_VLLM_KEYS = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint"}
_INT_KEYS = {"buffer_steps", "hwm", "max_queue_size"}
_KEYS = _VLLM_KEYS | _INT_KEYS | {"topic", "hash_seed", "int_block_hashes"}


def check_endpoint(endpoint: Any, what: str = "endpoint") -> str:
    if not isinstance(endpoint, str) or not endpoint:
        raise ValueError(f"{what} must be a ZMQ address such as tcp://*:5557")
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ValueError(f"{what} {endpoint!r}: use tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{what} {endpoint!r}: tcp needs HOST:PORT (port 1..65535)")
    return endpoint


def parse_kv_events(text: str | None) -> KVEventsSettings | None:
    """The settings `--kv-events` gives (see the module docstring); None when it turns
    events off (no value, enable_kv_cache_events false, publisher "null")."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if not text.startswith("{"):
        return KVEventsSettings(endpoint=check_endpoint(text))
    try:
        given = json.loads(text)
    except ValueError as err:
        raise ValueError(f"not a JSON object: {err}") from None
    if not isinstance(given, dict):
        raise ValueError("give a JSON object or an endpoint such as tcp://*:5557")
    unknown = sorted(set(given) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_KEYS))}")
    publisher = given.get("publisher", "zmq")
    if publisher not in ("zmq", "null", None):
        raise ValueError(f'publisher {publisher!r}: "zmq" or "null"')
    if given.get("enable_kv_cache_events", True) is False or publisher == "null":
        return None
    values: dict[str, Any] = {"endpoint": check_endpoint(given.get("endpoint", DEFAULT_ENDPOINT))}
    if given.get("replay_endpoint") is not None:
        values["replay_endpoint"] = check_endpoint(given["replay_endpoint"], "replay_endpoint")
    for key in _INT_KEYS & set(given):
        if not isinstance(given[key], int) or isinstance(given[key], bool) or given[key] < 1:
            raise ValueError(f"{key} must be a positive integer")
        values[key] = given[key]
    for key in ("topic", "hash_seed"):
        if key in given:
            if not isinstance(given[key], str):
                raise ValueError(f"{key} must be a string")
            values[key] = given[key]
    if "int_block_hashes" in given:
        if not isinstance(given["int_block_hashes"], bool):
            raise ValueError("int_block_hashes must be true or false")
        values["int_block_hashes"] = given["int_block_hashes"]
    return KVEventsSettings(**values)


def binds(endpoint: str) -> bool:
    """Whether the publisher binds `endpoint` (else it connects to a broker there)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme != "tcp":
        return True
    host = rest.rpartition(":")[0].strip("[]").lower()
    return host in ("*", "0.0.0.0", "::", "localhost", "::1") or host.startswith("127.")
