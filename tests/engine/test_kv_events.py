"""KV events as vLLM publishes them (engine/kv/kv_events.py, kv_event_publisher.py).

The messages are checked against the shape written down from vLLM's source
(vllm/distributed/kv_events.py) and vllm-router 0.1.17's decoder
(src/kv_index/decode.rs): tagged maps for events, a positional array for the
batch. The block hashes against vLLM's sha256_cbor chain, with golden values
computed by cbor2 (canonical=True) + hashlib, as vLLM computes them. Then the
tree's reports (stored chains, eviction, clears), the host and disk tiers'
(medium CPU and STORAGE, a flush's removals included), and a real ZMQ SUB socket
reading an engine on a tiny random checkpoint, replay included.
"""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq

from engine import LLM, SamplingParams
from engine.kv.kv_event_recorder import KVEventRecorder
from engine.kv.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockHasher,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsSettings,
    binds,
    cbor,
    decode_batch,
    encode_batch,
    external_hash,
    parse_kv_events,
)
from engine.kv.pages import PageAllocator
from engine.kv.radix import RadixCache

PAGE = 16
GREEDY = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)

# sha256(cbor2.dumps(x, canonical=True)), cbor2 5.x, as vllm/utils/hashing.py sha256_cbor.
NONE_HASH_SEED_0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
CHAIN_0_15 = "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"  # range(16)
CHAIN_1000_1015 = "d36f6c6fb9d31ddcf7699d8c86ea1fe3897ce82a35d6a9e87411bb38614a38b5"  # its child
SALTED = "b55bd54d69c476d62100aa9e18ff294d3ca6d991a3d5b455df3f645c630aa628"


# ----- the messages ------------------------------------------------------------------------


def test_a_batch_is_a_positional_array_of_tagged_maps():
    stored = BlockStored(
        block_hashes=[7, 8],
        parent_block_hash=None,
        token_ids=list(range(8)),
        block_size=4,
        lora_id=None,
        medium=MEDIUM_GPU,
        lora_name=None,
    )
    batch = KVEventBatch(
        ts=12.5,
        events=[stored, BlockRemoved(block_hashes=[8], medium=MEDIUM_GPU), AllBlocksCleared()],
        data_parallel_rank=0,
    )
    raw = msgspec.msgpack.decode(encode_batch(batch))
    assert raw == [
        12.5,
        [
            {
                "type": "BlockStored",
                "block_hashes": [7, 8],
                "parent_block_hash": None,
                "token_ids": list(range(8)),
                "block_size": 4,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            },
            {"type": "BlockRemoved", "block_hashes": [8], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ],
        0,
    ]
    # The field order is vLLM's, the tag first (vllm-router reads the map by name).
    assert list(raw[1][0]) == [
        "type",
        *("block_hashes", "parent_block_hash", "token_ids", "block_size"),
        *("lora_id", "medium", "lora_name"),
    ]
    assert decode_batch(encode_batch(batch)) == batch
    # array_like keeps every position (omit_defaults leaves none out): no rank is nil.
    assert msgspec.msgpack.decode(encode_batch(KVEventBatch(ts=1.0, events=[]))) == [1.0, [], None]


def test_bytes_hashes_stay_bytes_on_the_wire():
    stored = BlockStored(
        block_hashes=[b"\x01" * 32],
        parent_block_hash=b"\x02" * 32,
        token_ids=[1],
        block_size=1,
        lora_id=None,
        medium=MEDIUM_CPU,
        lora_name=None,
    )
    raw = msgspec.msgpack.decode(encode_batch(KVEventBatch(ts=0.0, events=[stored])))
    assert raw[1][0]["block_hashes"] == [b"\x01" * 32]
    assert raw[1][0]["parent_block_hash"] == b"\x02" * 32


# ----- the hashes -------------------------------------------------------------------------


def test_canonical_cbor_of_the_hashed_values():
    assert cbor(None) == b"\xf6"
    assert cbor(23) == b"\x17" and cbor(24) == b"\x18\x18" and cbor(500) == b"\x19\x01\xf4"
    assert cbor(70000) == b"\x1a\x00\x01\x11\x70" and cbor(2**32 + 1)[:1] == b"\x1b"
    assert cbor("0") == b"\x610" and cbor(b"ab") == b"\x42ab"
    assert cbor((1, (2, 3), None)) == b"\x83\x01\x82\x02\x03\xf6"


def test_block_hashes_are_vllms_sha256_cbor_chain():
    hasher = BlockHasher("0")
    assert hasher.none_hash.hex() == NONE_HASH_SEED_0
    first = hasher.block(None, range(16))
    assert first.hex() == CHAIN_0_15
    assert hasher.block(first, range(1000, 1016)).hex() == CHAIN_1000_1015
    assert hasher.chain(list(range(16)) + list(range(1000, 1016)) + [5], 16) == [
        first,
        bytes.fromhex(CHAIN_1000_1015),
    ]
    # The cache salt is the first block's extra key, (salt,), as vLLM's cache_salt.
    assert hasher.block(None, [70000, 5, 300, 2**32 + 1], "salt:x").hex() == SALTED
    assert BlockHasher("1").block(None, range(16)) != first
    assert external_hash(first, True) == int(CHAIN_0_15[-16:], 16)
    assert external_hash(first, False) == first


# ----- the setting --------------------------------------------------------------------------


def test_the_setting_takes_vllms_json_or_an_endpoint():
    assert parse_kv_events(None) is None
    assert parse_kv_events("tcp://*:5557") == KVEventsSettings(endpoint="tcp://*:5557")
    full = parse_kv_events(
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000", '
        '"replay_endpoint": "tcp://*:6001", "topic": "kv", "buffer_steps": 5, "hwm": 9, '
        '"max_queue_size": 7, "hash_seed": "42", "int_block_hashes": false}'
    )
    assert full == KVEventsSettings(
        endpoint="tcp://*:6000",
        replay_endpoint="tcp://*:6001",
        topic="kv",
        buffer_steps=5,
        hwm=9,
        max_queue_size=7,
        hash_seed="42",
        int_block_hashes=False,
    )
    assert parse_kv_events('{"endpoint": "tcp://*:6000"}').endpoint == "tcp://*:6000"
    assert parse_kv_events('{"enable_kv_cache_events": false}') is None
    assert parse_kv_events('{"publisher": "null"}') is None
    for bad in ("5557", "http://x:1", "tcp://host", '{"endpoint": 5}', '{"hwm": 0}', "{nope"):
        with pytest.raises(ValueError):
            parse_kv_events(bad)
    with pytest.raises(ValueError, match="unknown key"):
        parse_kv_events('{"enable": true}')
    sources = full.event_sources()["0"]  # what vllm-router's discovery reads
    assert sources["endpoint"] == "tcp://*:6000" and sources["replay_endpoint"] == "tcp://*:6001"
    assert (sources["publisher"], sources["encoding"], sources["schema_version"]) == (
        "zmq",
        "msgpack",
        1,
    )
    assert binds("tcp://*:1") and binds("tcp://127.0.0.1:1") and binds("ipc:///tmp/x")
    assert not binds("tcp://broker.internal:5557")


# ----- the tree's reports ---------------------------------------------------------------------


def tree(pages: int = 16) -> tuple[RadixCache, PageAllocator, KVEventRecorder]:
    allocator = PageAllocator(pages)
    recorder = KVEventRecorder(4, int_block_hashes=False)
    return RadixCache(allocator, 4, events=recorder), allocator, recorder


def insert(cache: RadixCache, allocator: PageAllocator, tokens: list[int], salt: str = ""):
    pages = allocator.allocate(len(tokens) // 4)
    cache.insert(tokens, pages, salt)
    allocator.release(pages)  # the tree alone holds them


def test_stored_pages_chain_to_their_parent():
    cache, allocator, recorder = tree()
    hasher = BlockHasher("0")
    insert(cache, allocator, list(range(12)))
    insert(cache, allocator, list(range(8)) + [50, 51, 52, 53])
    events, lost = recorder.take()
    assert not lost
    first, second = events
    expected = hasher.chain(list(range(12)), 4)
    assert first.block_hashes == expected and first.parent_block_hash is None
    assert first.token_ids == list(range(12)) and first.block_size == 4
    assert first.medium == MEDIUM_GPU
    # Only the new page, its parent the shared second page.
    assert second.block_hashes == [hasher.block(expected[1], [50, 51, 52, 53])]
    assert second.parent_block_hash == expected[1] and second.token_ids == [50, 51, 52, 53]
    insert(cache, allocator, list(range(12)))  # nothing new: nothing to say
    assert recorder.take() == ([], False)


def test_salted_prefixes_hash_apart():
    cache, allocator, recorder = tree()
    insert(cache, allocator, list(range(4)), salt="tenant")
    insert(cache, allocator, list(range(4)))
    salted, plain = recorder.take()[0]
    assert salted.block_hashes != plain.block_hashes
    assert salted.block_hashes == [BlockHasher("0").block(None, range(4), "tenant")]


def test_eviction_removes_and_clear_clears():
    cache, allocator, recorder = tree()
    insert(cache, allocator, list(range(12)))
    stored = recorder.take()[0][0].block_hashes
    assert cache.evict(1) == 1
    assert recorder.take()[0] == [BlockRemoved(block_hashes=[stored[2]], medium=MEDIUM_GPU)]
    cache.clear()
    assert recorder.take()[0] == [AllBlocksCleared()]


def test_a_clear_that_leaves_held_pages_reports_what_went():
    cache, allocator, recorder = tree()
    insert(cache, allocator, list(range(8)))
    held = allocator.allocate(1)  # a running sequence's last page, offered to the tree
    cache.insert([60, 61, 62, 63], held)
    hashes = [event.block_hashes for event in recorder.take()[0]]
    cache.clear()  # the held page stays, the rest goes: no AllBlocksCleared
    assert recorder.take()[0] == [BlockRemoved(block_hashes=hashes[0][::-1], medium=MEDIUM_GPU)]
    assert cache.num_pages == 1
    allocator.release(held)
    cache.clear()
    assert recorder.take()[0] == [AllBlocksCleared()]


def test_a_full_queue_drops_and_says_so():
    recorder = KVEventRecorder(4, max_pending=2)
    for _ in range(3):
        recorder.cleared()
    events, lost = recorder.take()
    assert events == [] and lost and recorder.dropped == 3
    recorder.cleared()
    assert recorder.take() == ([AllBlocksCleared()], False)


# ----- an engine, read by a real ZMQ SUB socket ------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Subscriber:
    """A SUB socket on a publisher: (topic, seq, batch) of every message it gets."""

    def __init__(self, endpoint: str):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.connect(endpoint)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.received: list[tuple[bytes, int, KVEventBatch, bytes]] = []
        time.sleep(0.3)  # the subscription reaches the publisher (ZMQ's slow joiner)

    def until(self, done, timeout: float = 10.0) -> list:
        """Receive until `done(events so far)`; every event received, in order."""
        deadline = time.monotonic() + timeout
        while not done(self.events()):
            assert time.monotonic() < deadline, f"no such events; got {self.events()}"
            if self.socket.poll(100):
                topic, seq, payload = self.socket.recv_multipart()
                self.received.append(
                    (topic, int.from_bytes(seq, "big", signed=True), decode_batch(payload), payload)
                )
        return self.events()

    def events(self) -> list:
        return [event for _, _, batch, _ in self.received for event in batch.events]

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


def stored_of(events, medium=MEDIUM_GPU) -> list:
    return [
        h
        for e in events
        if isinstance(e, BlockStored) and e.medium == medium
        for h in e.block_hashes
    ]


def removed_of(events, medium=MEDIUM_GPU) -> list:
    return [
        h
        for e in events
        if isinstance(e, BlockRemoved) and e.medium == medium
        for h in e.block_hashes
    ]


def wire(tokens: list[int]) -> list[int]:
    """The published hashes of `tokens`' full pages, as a router computes them."""
    return [external_hash(h, True) for h in BlockHasher("0").chain(tokens, PAGE)]


def test_an_engine_publishes_its_cache_over_zmq_and_replays_it(tiny_llama_dir, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    port, replay_port = free_port(), free_port()
    setting = (
        f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": '
        f'"tcp://127.0.0.1:{port}", "replay_endpoint": "tcp://127.0.0.1:{replay_port}"}}'
    )
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_dtype="auto", kv_events=setting)
    sub = Subscriber(f"tcp://127.0.0.1:{port}")
    try:
        prompt = list(range(3, 3 + 3 * PAGE)) + [7, 8, 9]
        llm.generate([prompt], GREEDY)
        events = sub.until(lambda ev: len(stored_of(ev)) >= 3)
        first = next(e for e in events if isinstance(e, BlockStored))
        assert first.token_ids == prompt[: 3 * PAGE] and first.block_size == PAGE
        assert first.parent_block_hash is None and first.lora_id is None
        assert stored_of(events)[:3] == wire(prompt)  # computable from the token ids
        topic, seq, batch, _ = sub.received[0]
        assert topic == b"" and seq == 0 and batch.data_parallel_rank == 0
        assert abs(batch.ts - time.time()) < 60

        other = prompt[: 2 * PAGE] + list(range(200, 200 + PAGE)) + [5]
        llm.generate([other], GREEDY)
        events = sub.until(lambda ev: wire(other)[2] in stored_of(ev))
        chained = next(e for e in events if isinstance(e, BlockStored) and e.token_ids[0] == 200)
        assert chained.parent_block_hash == wire(prompt)[1]  # the shared second page

        llm.engine.prefix_cache.clear()  # what /flush_cache does: nothing runs, all goes
        sub.until(lambda ev: any(isinstance(e, AllBlocksCleared) for e in ev))
        assert [s for _, s, _, _ in sub.received] == list(range(len(sub.received)))

        replayed = replay(f"tcp://127.0.0.1:{replay_port}", start=1)
        assert replayed == [(b"", seq, payload) for _, seq, _, payload in sub.received[1:]]
        stats = llm.engine.stats()
        assert stats["kv_events_batches"] == len(sub.received) and stats["kv_events_dropped"] == 0
    finally:
        sub.close()
        llm.close()
    with zmq.Context() as context, context.socket(zmq.PUB) as again:
        again.bind(f"tcp://127.0.0.1:{port}")  # closed with the engine: the port is free
        again.close(0)


def replay(endpoint: str, start: int) -> list[tuple[bytes, int, bytes]]:
    """Ask the replay socket as vllm-router does (a DEALER: [b"", start]); (topic, seq,
    payload) of every batch it sends before the end marker."""
    with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert dealer.poll(5000), "no replay answer"
            empty, topic, seq, payload = dealer.recv_multipart()
            assert empty == b""
            number = int.from_bytes(seq, "big", signed=True)
            if number == -1:
                assert topic == payload == b""
                dealer.close(0)
                return out
            out.append((topic, number, payload))


HOST_PAGE_BYTES = 512 * PAGE  # float32 tiny llama with kv_cache_dtype auto


def spilling_llm(model_dir, port: int, **tiers) -> LLM:
    """A pool of 8 pages: a pinned 5-page prefix and a 120-token prompt do not fit."""
    return LLM(
        str(model_dir),
        dtype="float32",
        kv_cache_dtype="auto",
        max_model_len=128,
        kv_memory=HOST_PAGE_BYTES * 8 / 1024**3,
        kv_events=f"tcp://127.0.0.1:{port}",
        **tiers,
    )


PREFIX = list(range(3, 3 + 5 * PAGE))
BIG = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def test_pinned_pages_spilled_to_host_memory_say_cpu(tiny_llama_dir):
    port = free_port()
    llm = spilling_llm(tiny_llama_dir, port, kv_host_gib=HOST_PAGE_BYTES * 16 / 1024**3)
    sub = Subscriber(f"tcp://127.0.0.1:{port}")
    try:
        llm.generate([PREFIX + [7, 8]], GREEDY)
        llm.engine.pin_prefix(PREFIX)
        llm.generate([[250] * 120], BIG)  # every page of the pool: the pinned ones give way
        hashes = wire(PREFIX)
        events = sub.until(lambda ev: set(hashes) <= set(stored_of(ev, MEDIUM_CPU)))
        assert set(hashes) <= set(removed_of(events))  # they left the pool ...
        cpu = [e for e in events if isinstance(e, BlockStored) and e.medium == MEDIUM_CPU]
        for event in cpu:  # ... into host memory, each chained to its parent
            index = hashes.index(event.block_hashes[0])
            assert event.parent_block_hash == (hashes[index - 1] if index else None)
            assert event.token_ids == PREFIX[index * PAGE : (index + 1) * PAGE]

        again = llm.generate([PREFIX + [7, 8]], GREEDY)[0]
        assert again.num_cached_tokens == 5 * PAGE  # restored from the host tier ...
        seen = len(events)
        sub.until(  # ... so out of host memory, and back in the pool
            lambda ev: (
                set(hashes) <= set(removed_of(ev, MEDIUM_CPU))
                and set(hashes) <= set(stored_of(ev[seen:]))
            )
        )
    finally:
        sub.close()
        llm.close()


def test_pages_written_to_disk_say_storage(tiny_llama_dir, tmp_path):
    port = free_port()
    llm = spilling_llm(tiny_llama_dir, port, kv_disk=True, kv_disk_dir=str(tmp_path), kv_host_gib=0)
    sub = Subscriber(f"tcp://127.0.0.1:{port}")
    try:
        llm.generate([PREFIX + [7, 8]], GREEDY)
        assert llm.engine.save_prefix(PREFIX) == 5
        hashes = wire(PREFIX)
        events = sub.until(lambda ev: set(hashes) <= set(stored_of(ev, MEDIUM_STORAGE)))
        storage = [e for e in events if isinstance(e, BlockStored) and e.medium == MEDIUM_STORAGE]
        assert [e.token_ids for e in storage] == [
            PREFIX[i * PAGE : (i + 1) * PAGE] for i in range(5)
        ]
    finally:
        sub.close()
        llm.close()


def test_a_flush_reports_the_host_and_disk_pages_it_drops(tiny_llama_dir, tmp_path):
    """A flush empties the host tier and the disk tier through their own methods, so a
    router that was told of CPU and STORAGE copies hears that they are gone."""
    port = free_port()
    llm = spilling_llm(
        tiny_llama_dir,
        port,
        kv_host_gib=HOST_PAGE_BYTES * 16 / 1024**3,
        kv_disk=True,
        kv_disk_dir=str(tmp_path),
    )
    sub = Subscriber(f"tcp://127.0.0.1:{port}")
    try:
        llm.generate([PREFIX + [7, 8]], GREEDY)
        assert llm.engine.save_prefix(PREFIX) == 5  # on disk ...
        llm.engine.pin_prefix(PREFIX)
        llm.generate([[250] * 120], BIG)  # ... and, pushed out of the pool, in host memory
        hashes = set(wire(PREFIX))
        sub.until(
            lambda ev: (
                hashes <= set(stored_of(ev, MEDIUM_CPU))
                and hashes <= set(stored_of(ev, MEDIUM_STORAGE))
            )
        )
        seen = len(sub.events())

        report = llm.engine.flush_prefix_cache()
        assert (report["host_pages"], report["disk_pages"]) == (5, 5)
        events = sub.until(
            lambda ev: (
                any(isinstance(e, AllBlocksCleared) for e in ev[seen:])
                and hashes <= set(removed_of(ev[seen:], MEDIUM_CPU))
                and hashes <= set(removed_of(ev[seen:], MEDIUM_STORAGE))
            )
        )[seen:]
        for medium in (MEDIUM_CPU, MEDIUM_STORAGE):  # each reported once, nothing else
            assert sorted(removed_of(events, medium)) == sorted(hashes)
            assert not stored_of(events, medium)
        seen += len(events)
        llm.engine.flush_prefix_cache()  # nothing left: nothing more to report
        events = sub.until(lambda ev: any(isinstance(e, AllBlocksCleared) for e in ev[seen:]))
        assert not removed_of(events[seen:], MEDIUM_CPU)
        assert not removed_of(events[seen:], MEDIUM_STORAGE)
    finally:
        sub.close()
        llm.close()


def test_a_bad_setting_is_a_usage_error_and_a_taken_port_an_engine_error(tiny_llama_dir):
    from typer.testing import CliRunner

    from agent.cli import app
    from engine.errors import EngineError

    result = CliRunner().invoke(app, ["serve", "--model", "/nonexistent", "--kv-events", "5557"])
    assert result.exit_code == 2 and "--kv-events" in result.output, result.output
    with zmq.Context() as context, context.socket(zmq.PUB) as taken:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(EngineError, match=f"KV events on tcp://127.0.0.1:{port}"):
            LLM(str(tiny_llama_dir), dtype="float32", kv_events=f"tcp://127.0.0.1:{port}")
        taken.close(0)
