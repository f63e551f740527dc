"""The KV-event publisher: a ZMQ PUB socket (and a replay ROUTER) on a thread of its own.

The engine thread reports events to a KVEventRecorder (engine/kv/kv_event_recorder.py),
which only appends them under a lock. This thread takes what has gathered,
cuts it into batches of at most MAX_BATCH_EVENTS (vllm-router refuses more
than 4096 per batch), encodes each as a KVEventBatch and sends the three
frames vLLM sends: topic, sequence number (8 bytes, big-endian), payload.
Sends never block: the PUB socket drops messages for a subscriber past its
high-water mark (`hwm`), as vLLM's does. When the recorder had to drop events
(more than `max_queue_size` waiting), one sequence number is skipped, so a
subscriber sees the gap and stops trusting what it knew of this worker.

With `replay_endpoint`, a ROUTER socket answers a replay request (the first
sequence number wanted, 8 bytes big-endian) with every kept batch from there on
and an end marker (see kv_events.py); the last `buffer_steps` batches are kept.

ZMQ sockets are not thread-safe, so both live on this thread alone; binding
happens there too, and the constructor waits for it, so a taken port is an
error at start-up. `close` sends what is left, then stops the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import zmq

from engine.errors import EngineError
from engine.kv.kv_event_recorder import KVEventRecorder
from engine.kv.kv_events import KVEventBatch, KVEventsSettings, binds, encode_batch

log = logging.getLogger(__name__)
MAX_BATCH_EVENTS = 1024
END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_SECONDS = 0.05


class KVEventsError(EngineError):
    """The KV-event publisher could not start (an address taken or malformed)."""


class KVEventPublisher:
    def __init__(
        self, settings: KVEventsSettings, block_size: int, data_parallel_rank: int = 0
    ) -> None:
        self.settings = settings
        self.recorder = KVEventRecorder(
            block_size,
            seed=settings.seed,
            int_block_hashes=settings.int_block_hashes,
            max_pending=settings.max_queue_size,
        )
        self.data_parallel_rank = data_parallel_rank
        self.topic = settings.topic.encode()
        self.batches = self.events = self.skipped = 0
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer_steps)
        self._running = True
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            self._thread.join()
            raise KVEventsError(f"KV events on {settings.endpoint}: {self._error}") from None
        host = settings.endpoint.partition("://")[2].rpartition(":")[0]
        if binds(settings.endpoint) and host in ("*", "0.0.0.0", "::", "[::]"):
            log.warning(
                "KV events are published on every interface (%s), without authentication, "
                "and carry prompts' token ids: keep the port behind a firewall",
                settings.endpoint,
            )
        log.info(
            "publishing KV events on %s%s (block size %d)",
            settings.endpoint,
            f", replay on {settings.replay_endpoint}" if settings.replay_endpoint else "",
            block_size,
        )

    # ----- the engine's side ----------------------------------------------------------
    def close(self) -> None:
        """Send what is waiting, then stop the thread and close the sockets."""
        if self._running:
            self._running = False
            self.recorder.wake()
            self._thread.join(timeout=5)

    def stats(self) -> dict:
        return {
            "kv_events_batches": self.batches,
            "kv_events_sent": self.events,
            "kv_events_dropped": self.recorder.dropped,
        }

    # ----- the thread -----------------------------------------------------------------
    def _open(self, context: zmq.Context) -> tuple[zmq.Socket, zmq.Socket | None]:
        settings = self.settings
        pub = context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 1000)  # what close sends still leaves
        pub.set_hwm(settings.hwm)
        replay = None
        try:
            if binds(settings.endpoint):
                pub.bind(settings.endpoint)
            else:
                pub.connect(settings.endpoint)
            if settings.replay_endpoint:
                replay = context.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(settings.replay_endpoint)
        except zmq.ZMQError:
            pub.close(0)
            if replay is not None:
                replay.close(0)
            raise
        return pub, replay

    def _run(self) -> None:
        context = zmq.Context()
        try:
            pub, replay = self._open(context)
        except zmq.ZMQError as err:
            self._error = err
            self._started.set()
            context.term()
            return
        self._started.set()
        try:
            while True:
                running = self._running
                if replay is not None:
                    while replay.poll(0):
                        self._serve_replay(replay)
                events, lost = self.recorder.take(POLL_SECONDS if running else None)
                if lost:
                    self._seq += 1  # a gap the subscribers see: what they knew is stale
                    self.skipped += 1
                for start in range(0, len(events), MAX_BATCH_EVENTS):
                    self._send(pub, events[start : start + MAX_BATCH_EVENTS])
                if not running and not events:
                    break
        except Exception:  # a bug here must not take the engine down with it
            log.exception("the KV-event publisher stopped")
        finally:
            pub.close()
            if replay is not None:
                replay.close(0)
            context.term()

    def _send(self, pub: zmq.Socket, events: list) -> None:
        batch = KVEventBatch(
            ts=time.time(), events=events, data_parallel_rank=self.data_parallel_rank
        )
        payload, seq = encode_batch(batch), self._seq
        self._seq += 1
        try:
            pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:  # a connecting publisher with no peer yet: the batch is lost
            self.skipped += 1
        else:
            self.batches += 1
            self.events += len(events)
        self._buffer.append((seq, payload))

    def _serve_replay(self, replay: zmq.Socket) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring a malformed KV-event replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                replay.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))


def open_publisher(settings: KVEventsSettings | None, block_size: int) -> KVEventPublisher | None:
    """A running publisher for these settings, or None when events are off."""
    return KVEventPublisher(settings, block_size) if settings is not None else None
