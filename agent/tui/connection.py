"""Noticing that the engine is gone, saying so, and checking until it is back.

The HTTP client already retries each request (with backoff) before it gives
up; when it does, the TUI shows a banner and probes the server on a growing
interval, and says when it answers again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from agent.tui.widgets.banner import ConnectionBanner

DEFAULT_DELAYS_S: tuple[float, ...] = (1, 2, 4, 8, 15)


class ConnectionWatcher:
    def __init__(
        self,
        banner: ConnectionBanner,
        probe: Callable[[], Awaitable[bool]],
        where: str,
        delays: Sequence[float] = DEFAULT_DELAYS_S,
    ) -> None:
        self.banner = banner
        self.probe = probe
        self.where = where
        self.delays = tuple(delays) or DEFAULT_DELAYS_S
        self.attempts = 0
        self._done: asyncio.Event | None = None

    @property
    def watching(self) -> bool:
        return self._done is not None and not self._done.is_set()

    async def wait_until_back(self) -> None:
        """Show the banner and return once the server answers (one watch at a time)."""
        if self.watching:
            assert self._done is not None
            await self._done.wait()
            return
        self._done = asyncio.Event()
        try:
            self.attempts = 0
            while True:
                delay = self.delays[min(self.attempts, len(self.delays) - 1)]
                self.attempts += 1
                self.banner.show_lost(self.where, self.attempts, delay)
                await asyncio.sleep(delay)
                if await self.probe():
                    self.banner.show_restored(self.where)
                    return
        finally:
            self._done.set()
