"""AsyncEngine: the LLMEngine driven by one background thread, streamed to asyncio callers.

The engine is not thread-safe, so every touch of it (adding, aborting,
stepping, reading stats) happens on the engine thread; callers hand it
commands through a queue and get results back through futures and per-request
asyncio queues. torch releases the GIL inside its kernels, so the event loop
stays responsive while a step runs.

The engine thread owns the process's one OpenMP team (engine.host.threads):
it runs its kernels on every usable core, and the thread that built the
engine (the server's event loop, the agent's TUI) hands its own pool back and
runs one thread, so no second team keeps the engine's from spinning.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.errors import WorkerDiedError
from engine.host.threads import claim_compute_threads, quiet_this_thread, restore_this_thread
from engine.kv.calibration import calibrate_without_fixed_scales
from engine.llm import LLM
from engine.requests.outputs import RequestOutput
from engine.requests.pacing import OutputPacer
from engine.requests.params import SamplingParams

log = logging.getLogger(__name__)
# How long the stats of a failed engine wait for its thread (AsyncEngine.stats).
FAILED_STATS_WAIT_S = 2.0


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for stream, output in items:
        stream.put_nowait(output)


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; no more requests can be served."""


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None):
        self.engine = engine or LLMEngine(config)
        self.config = self.engine.config
        self._commands: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopped = threading.Event()
        # Streams get a step's tokens together with the next steps' for a few ms, so
        # their consumers wake less often than the engine steps (engine.requests.pacing).
        self._pacer = OutputPacer(self.config.stream_interval_ms / 1000)
        # The engine was sized on this thread (capped at the usable cores, split between
        # tensor-parallel ranks, or as the user set it); its thread takes the same count.
        self._compute_threads = torch.get_num_threads()
        self._claimed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="resident-engine", daemon=True)
        self._thread.start()
        self._claimed.wait()
        # The caller built the engine, so it holds an OpenMP pool; handed back, it no
        # longer counts against the engine thread's team (restored at shutdown).
        self._quieted = (threading.get_ident(), quiet_this_thread())
        # A tensor-parallel rank that dies fails every pending request at once, from
        # the thread that saw it, even while the engine thread waits on that rank.
        self.engine.on_failure(self._on_engine_failure)

    @classmethod
    def open(cls, config: EngineConfig) -> AsyncEngine:
        """The engine as `resident serve` runs it: an FP8 cache without fixed scales is
        calibrated on a built-in sample first, so the first request, however short,
        does not set them (engine.kv.calibration)."""
        engine = LLMEngine(config)
        calibrate_without_fixed_scales(LLM.from_engine(engine))
        return cls(engine=engine)

    def is_alive(self) -> bool:
        """Whether the engine thread is still serving (for health checks)."""
        return (
            self._thread.is_alive() and not self._stopped.is_set() and self.engine.failure is None
        )

    def failure(self) -> str | None:
        """Why the engine cannot serve (a tensor-parallel rank died), or None."""
        return self.engine.failure

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    # ----- the engine thread ----------------------------------------------------
    def _loop(self) -> None:
        try:
            claim_compute_threads(self._compute_threads)
        finally:  # the constructor waits for this, whatever happened
            self._claimed.set()
        while not self._stopped.is_set():
            ran = self._run_commands(block=not self.engine.has_unfinished())
            if self._pacer.holding and (
                ran or not self.engine.has_unfinished() or self._pacer.due()
            ):  # a command may start a long prefill: what is held goes before it
                self._deliver_step(self._pacer.take())
            if self._stopped.is_set() or not self.engine.has_unfinished():
                continue
            start = time.monotonic()
            try:
                outputs = self.engine.step()
            except WorkerDiedError as err:  # logged when it happened; no traceback per step
                self._fail_all(err)
                continue
            except Exception as err:  # a bug or a failed check: fail requests, keep serving
                log.exception("engine step failed")
                self._fail_all(err)
                continue
            self._pacer.last_step = time.monotonic() - start
            self._deliver_step(self._pacer.admit(outputs))

    def _run_commands(self, block: bool) -> bool:
        """Run the queued commands (waiting up to 0.5 s for one if `block`); whether any ran."""
        try:
            command, future = self._commands.get(timeout=0.5 if block else 0)
        except queue.Empty:
            return False
        while True:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(command())
                except BaseException as err:  # handed back to the caller
                    future.set_exception(err)
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, one wake-up per event loop rather than one per request: each
        wake-up is a system call on the engine thread while its OpenMP team waits."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for output in outputs:
            target = self._streams.get(output.request_id)
            if target is None:
                continue
            loop, stream = target
            if output.finished:
                self._streams.pop(output.request_id, None)
            by_loop.setdefault(loop, []).append((stream, output))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the caller's loop is closed
                pass

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        loop, stream = target
        if isinstance(item, BaseException) or item.finished:
            self._streams.pop(request_id, None)
        try:
            loop.call_soon_threadsafe(stream.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed
            pass

    def _fail_all(self, err: BaseException) -> None:
        self._deliver_step(self._pacer.take())  # the tokens made before the failure first
        for request_id in list(self._streams):
            self.engine.abort(request_id)
            self._deliver(request_id, err)

    def _on_engine_failure(self, message: str) -> None:
        """Any thread: fail every waiting caller now. The engine thread aborts the
        requests themselves when its next step raises."""
        for request_id in list(self._streams):
            self._deliver(request_id, WorkerDiedError(message))

    # ----- caller side ------------------------------------------------------------
    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread and await its result."""
        if self.engine.failure is not None:
            raise WorkerDiedError(self.engine.failure)
        return await self._submit(fn)

    async def _submit(self, fn: Callable[[], Any]) -> Any:
        if self._stopped.is_set() or not self._thread.is_alive():
            raise EngineDeadError("the engine has stopped")
        future: Future = Future()
        self._commands.put((fn, future))
        return await asyncio.wrap_future(future)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str = "",
    ) -> AsyncIterator[RequestOutput]:
        """Outputs for one request as it progresses; the last has `finished` set.

        Validation errors (prompt too long, bad token ids, a full queue) are
        raised before the first output. Leaving the loop early (a client that
        disconnected) aborts the request and frees its pages at once.
        """
        loop = asyncio.get_running_loop()
        stream: asyncio.Queue = asyncio.Queue()
        if params.structured is not None:
            # Compiling a grammar costs milliseconds, and the first one walks the
            # whole vocabulary (seconds for Kimi's): done here, off the engine
            # thread, it is cached when `add` asks, and the batch keeps stepping.
            from engine.grammar.backend import precompile  # xgrammar only when used

            await asyncio.to_thread(precompile, self.engine, params)

        def add() -> None:
            self.engine.add_request(prompt, params, request_id=request_id, cache_salt=cache_salt)
            self._streams[request_id] = (loop, stream)

        await self.call(add)
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._streams.pop(request_id, None)
                self._commands.put((lambda: self.engine.abort(request_id), Future()))

    async def abort(self, request_id: str) -> None:
        await self.call(lambda: self.engine.abort(request_id))

    async def stats(self) -> dict:
        """The engine's stats, also after a failure (ranks_alive). A failed engine's thread
        may sit in a step on a dead rank until the transport gives up: after
        FAILED_STATS_WAIT_S the answer is what needs no engine thread (the failure and
        the ranks), not a hang."""
        stats_call = self._submit(self.engine.stats)
        if self.engine.failure is None:
            stats = await stats_call
        else:
            try:
                stats = await asyncio.wait_for(stats_call, FAILED_STATS_WAIT_S)
            except TimeoutError:
                stats = {
                    "failure": self.engine.failure,
                    "parallel": self.engine.executor.describe(),
                }
        return {**stats, "stream_interval_ms": self._pacer.interval * 1000}

    async def load(self) -> dict:
        """Requests running and waiting and KV use (what routers poll: /get_load)."""
        return await self.call(self.engine.load)

    async def kv_event_sources(self) -> dict:
        """Where KV events are published (a fixed setting: read without the engine thread)."""
        return self.engine.kv_event_sources()

    async def flush_cache(self) -> dict[str, int]:
        """Forget every cached prefix: the tree, pinned pages included, the host tier and
        this engine's pages on disk (engine/core/prefix_tiers.py); what went and what
        stayed. Pages running requests hold stay."""
        return await self.call(self.engine.flush_prefix_cache)

    async def pin_prefix(self, token_ids: list[int], cache_salt: str = "") -> Any:
        """Keep the cached pages of this prefix from eviction; the handle is for unpin."""
        return await self.call(lambda: self.engine.pin_prefix(token_ids, cache_salt))

    async def unpin_prefix(self, handle: Any) -> None:
        await self.call(lambda: self.engine.unpin_prefix(handle))

    async def save_prefix(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Save this prefix's cached pages to the disk tier; returns pages newly written.

        The pages' bytes are copied on the engine thread; the files are written
        off it, so the batch keeps stepping meanwhile."""
        store = self.engine.prefix_store
        if store is None:
            return 0
        job = await self.call(lambda: store.collect(list(token_ids), cache_salt))
        return await asyncio.to_thread(store.write, job)

    async def restore_prefix(self, token_ids: list[int], cache_salt: str = "") -> int:
        """Load this prefix's saved pages into the prefix cache; returns tokens restored.

        The files are read and checked off the engine thread (tens of MB for a
        repository), so the batch keeps stepping; only the copy into the pool
        and the tree runs on it."""
        store = self.engine.prefix_store
        if store is None:
            return 0
        plan = await self.call(lambda: store.plan(list(token_ids), cache_salt))
        if plan is None:
            return 0
        records = await asyncio.to_thread(store.read, plan)
        return await self.call(lambda: store.place(plan, records))

    async def restore_saved(self) -> int:
        """Restore the saved prefixes of this engine (a server starting)."""
        store = self.engine.prefix_store
        return 0 if store is None else await self.call(store.restore_saved)

    async def save_cached(self) -> int:
        """Save the prefixes the cache holds, pinned first (a server stopping)."""
        store = self.engine.prefix_store
        if store is None:
            return 0
        written = 0
        for tokens, salt in reversed(await self.call(store.cached_prefixes)):
            written += await self.save_prefix(tokens, salt)  # newest last: evicted last
        return written

    def shutdown(self) -> None:
        """Stop the engine thread, then the engine's worker ranks, if any."""
        self._stopped.set()
        self._thread.join(timeout=10)
        caller, threads = self._quieted
        if caller == threading.get_ident():
            restore_this_thread(threads)
        self.engine.close()
