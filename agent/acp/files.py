"""The client's `fs/read_text_file` and `fs/write_text_file` as the file tools' editor.

Tools run in worker threads (`Registry.run_async`), while the ACP connection
lives on the event loop; each read or write is sent to the loop and the
worker waits for the answer. A read that fails or times out falls back to
the disk (the disk is always a valid answer, just not the freshest); a write
that fails is an error the model sees, never a silent write behind the
editor's back. Called on the loop's own thread it declines at once, since
waiting there would wait forever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from acp.interfaces import Client

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0
WRITE_TIMEOUT_S = 60.0


class ClientFiles:
    def __init__(
        self,
        client: Client,
        loop: asyncio.AbstractEventLoop,
        *,
        reads: bool,
        writes: bool,
    ) -> None:
        self.client = client
        self.loop = loop
        self.reads = reads
        self.writes = writes
        self.session_id: str | None = None  # known once the session is open
        self._loop_thread = threading.get_ident()

    @property
    def offered(self) -> bool:
        return self.reads or self.writes

    def _usable(self) -> bool:
        return self.session_id is not None and threading.get_ident() != self._loop_thread

    def _wait(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    async def read_text_async(self, path: Path) -> str | None:
        """The same read, from the loop itself (for previews); None when it fails."""
        if not self.reads or self.session_id is None:
            return None
        request = self.client.read_text_file(session_id=self.session_id, path=str(path))
        try:
            response = await asyncio.wait_for(request, READ_TIMEOUT_S)
        except Exception as err:
            log.warning("the client could not read %s (%s)", path, err)
            return None
        return response.content

    def read_text(self, path: Path) -> str | None:
        if not self.reads or not self._usable():
            return None
        request = self.client.read_text_file(session_id=self.session_id, path=str(path))
        try:
            response = self._wait(request, READ_TIMEOUT_S)
        except Exception as err:
            log.warning("the client could not read %s (%s); reading the disk", path, err)
            return None
        return response.content

    def write_text(self, path: Path, content: str) -> bool:
        if not self.writes or not self._usable():
            return False
        request = self.client.write_text_file(
            session_id=self.session_id, path=str(path), content=content
        )
        try:
            self._wait(request, WRITE_TIMEOUT_S)
        except Exception as err:
            raise OSError(f"the editor did not write it: {err or type(err).__name__}") from err
        return True
