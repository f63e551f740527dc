"""The model behind ACP sessions: an attached server, or one local engine for all of them.

An editor may open several sessions over one connection. Attached, each
session gets its own HTTP client, as a new session in the TUI does. Local,
loading the model once per session would cost its memory again and again,
so the first session starts the engine (in a worker thread, so the
connection keeps answering meanwhile) and every session talks to it through
a view whose `aclose` leaves it running; the engine stops when the server
does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agent.core.clients import ChatRequest, LLMClient, StreamItem, start_local_client
from agent.core.runtime import RuntimeOptions


class SharedClient(LLMClient):
    """A session's view of the shared local client; closing it closes nothing."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner
        self.model = inner.model
        self.token_count_method = inner.token_count_method

    async def context_window(self) -> int:
        return await self.inner.context_window()

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamItem]:
        return self.inner.stream(request)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def describe(self) -> str:
        return self.inner.describe()

    async def aclose(self) -> None:
        pass


class Engines:
    def __init__(self, options: RuntimeOptions) -> None:
        self.options = options
        self._local: asyncio.Task[LLMClient] | None = None

    async def client_for_session(self) -> LLMClient | None:
        """The client a new session uses; None: `open_runtime` makes its own (attached)."""
        if self.options.attach:
            return None
        if self._local is None or _failed(self._local):  # a failed load is tried again
            model = self.options.model  # None: the engine's default model
            self._local = asyncio.ensure_future(asyncio.to_thread(start_local_client, model))
        # shield: a cancelled session/new must not cancel the load other sessions wait for
        return SharedClient(await asyncio.shield(self._local))

    async def aclose(self) -> None:
        local, self._local = self._local, None
        if local is None:
            return
        if not local.done():
            local.cancel()  # the thread finishes its load; nothing will use it
            return
        if not _failed(local):
            await local.result().aclose()


def _failed(task: asyncio.Future) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)
