"""Running the engine requests behind one API request, and stopping them when the client leaves.

One API request can mean several engine requests (`n` choices, a list of
prompts). `GenerationGroup` starts them together (so their prefills batch),
waits until each has been accepted (so a validation error or a full queue is
still an HTTP error, not a broken stream), then yields their outputs as they
come, tagged with the choice index. Closing the group cancels the readers,
which aborts the engine requests and frees their pages (AsyncEngine.generate
does that when its consumer stops early). Metrics are observed here, the one
place every output passes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request

from engine.requests.outputs import RequestOutput
from engine.requests.params import SamplingParams
from engine.server.error_responses import ClientDisconnected
from engine.server.metrics import ServerMetrics
from engine.server.serving_engine import ServingEngine

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams


class _ChoiceTiming:
    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.last_token: float | None = None


class GenerationGroup:
    def __init__(
        self,
        engine: ServingEngine,
        jobs: list[Job],
        request_id: str,
        cache_salt: str,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.jobs = jobs
        self.request_id = request_id
        self.cache_salt = cache_salt
        self.metrics = metrics
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._buffered: list[tuple[int, RequestOutput]] = []
        arrival = time.monotonic()
        self._timing = [_ChoiceTiming(arrival) for _ in jobs]

    async def start(self) -> None:
        """Submit every job; raise the first error if any was refused (the rest are aborted)."""
        self._tasks = [
            asyncio.create_task(self._pump(index, job)) for index, job in enumerate(self.jobs)
        ]
        waiting_for = set(range(len(self.jobs)))
        try:
            while waiting_for:
                index, item = await self._queue.get()
                if isinstance(item, BaseException):
                    raise item
                self._buffered.append((index, item))
                waiting_for.discard(index)
        except BaseException:
            await self.close()
            raise

    async def _pump(self, index: int, job: Job) -> None:
        engine_request_id = self.request_id if len(self.jobs) == 1 else f"{self.request_id}-{index}"
        try:
            async for output in self.engine.generate(
                job.prompt_ids, job.params, engine_request_id, self.cache_salt
            ):
                self._observe(index, output)
                self._queue.put_nowait((index, output))
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # handed to the reader, which decides what the client sees
            self._queue.put_nowait((index, error))

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) until every choice has finished; raises an engine failure."""
        unfinished = set(range(len(self.jobs)))
        for index, output in self._buffered:
            if output.finished:
                unfinished.discard(index)
            yield index, output
        self._buffered = []
        while unfinished:
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                unfinished.discard(index)
            yield index, item

    async def close(self) -> None:
        """Cancel what still runs; each cancelled reader aborts its engine request."""
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _observe(self, index: int, output: RequestOutput) -> None:
        if self.metrics is None:
            return
        metrics = self.metrics
        timing = self._timing[index]
        completion = output.outputs[0]
        now = time.monotonic()
        new_tokens = len(completion.delta_token_ids)
        if new_tokens:
            if timing.last_token is None:
                metrics.time_to_first_token.observe(now - timing.arrival)
                metrics.prompt_tokens.inc(len(output.prompt_token_ids))
                metrics.cached_prompt_tokens.inc(output.num_cached_tokens)
            else:
                gap = (now - timing.last_token) / new_tokens
                for _ in range(new_tokens):
                    metrics.inter_token_latency.observe(gap)
            timing.last_token = now
            metrics.generation_tokens.inc(new_tokens)
        if output.finished:
            metrics.requests_finished.labels(finish_reason=completion.finish_reason or "none").inc()
            metrics.request_latency.observe(now - timing.arrival)


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so aborting its engine requests) if the client leaves.

    Streaming responses get this from Starlette; a plain JSON response would
    otherwise keep generating for nobody until max_tokens.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if watcher.done():
                raise ClientDisconnected()
        watcher.cancel()
    return task.result()
