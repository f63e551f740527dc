"""The session's MCP servers: started in the background, called from any thread, stopped together.

Start policy ("lazy", never blocking): `start()` returns at once; every
configured server then starts on the manager's own thread while the
session opens and the user types. Its tools can only be offered once it
has listed them, and the tool list is part of the cached prompt prefix, so
they join at an epoch boundary (see catalog.py): before the first turn the
agent waits for servers still starting, but never past a short grace
period; a slower server's tools arrive with the next turn after it is
ready. A server that never comes up costs its own tools, nothing else.

The servers live on a private asyncio loop in a daemon thread, not on the
agent's loop: a misbehaving server or SDK bug cannot stall the agent, tool
calls (which run in worker threads) reach the servers the same way from
any thread, and `stop()` works from synchronous code (the CLI, a closing
front end). Child processes are started from that thread; with the sandbox,
bubblewrap dies with it (`--die-with-parent`), and `stop()` ends every
server (stdin closed, then SIGTERM, then SIGKILL to its process group).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import mcp_types as types

from agent.core.mcp.config import McpConfig
from agent.core.mcp.connection import CallFailed, ServerConnection
from agent.core.mcp.status import ServerStatus, State
from tools.sandbox.grants import CommandSandbox, SandboxSettings

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 15.0  # the SDK's own shutdown takes at most ~6 s per server, all in parallel
CALL_MARGIN_S = 10.0  # past the server's own call timeout, in case the SDK itself hangs

StatusListener = Callable[[ServerStatus], None]


class McpManager:
    def __init__(
        self,
        config: McpConfig,
        workspace: Path,
        sandbox: CommandSandbox | None = None,
        settings: SandboxSettings | None = None,
        reserved: Iterable[str] = (),
        on_change: StatusListener | None = None,
    ) -> None:
        self.config = config
        self.on_change = on_change
        self._changed = threading.Condition()
        self.version = 0  # goes up each time a server becomes ready
        self.started_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.connections = {
            name: ServerConnection(
                server,
                workspace,
                sandbox,
                settings or SandboxSettings(),
                set(reserved),
                self._status_changed,
            )
            for name, server in sorted(config.servers.items())
        }

    # -- life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start every server in the background; returns at once."""
        if self._thread is not None or not self.connections:
            return
        self.started_at = time.monotonic()
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        def launch() -> None:
            for connection in self.connections.values():
                self._tasks.append(loop.create_task(connection.run()))

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="resident-mcp", daemon=True)
        self._thread.start()
        ready.wait()
        loop.call_soon_threadsafe(launch)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every server and the thread; quiet (no more status reports)."""
        self.on_change = None
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def stop_all() -> None:
            for connection in self.connections.values():
                connection.stop()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=timeout)

        try:
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(timeout + 2)
        except Exception as err:  # a stuck server must not keep the session from ending
            log.warning("MCP servers did not all stop: %s", err)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
        self._loop = None
        self._thread = None

    # -- state ----------------------------------------------------------------------------

    def _status_changed(self, status: ServerStatus) -> None:
        with self._changed:
            if status.state is State.READY:
                self.version += 1
            self._changed.notify_all()
        listener = self.on_change
        if listener is not None:
            try:
                listener(status)
            except Exception:
                log.exception("MCP status listener failed")

    def statuses(self) -> list[ServerStatus]:
        return [c.status for c in self.connections.values()]

    def starting(self) -> bool:
        return any(
            c.status.state in (State.PENDING, State.STARTING) for c in self.connections.values()
        )

    def wait_settled(self, timeout: float) -> bool:
        """Wait until no server is still starting; False when `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.starting():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    # -- calls ----------------------------------------------------------------------------

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        cancel: threading.Event | None = None,
    ) -> types.CallToolResult:
        """Call a tool from any thread but the manager's own. Raises CallFailed."""
        connection = self.connections.get(server)
        loop = self._loop
        if connection is None or loop is None:
            raise CallFailed(f"MCP server {server!r} is not running in this session")
        if threading.current_thread() is self._thread:
            raise CallFailed("an MCP tool cannot be called from the MCP thread itself")
        future = asyncio.run_coroutine_threadsafe(connection.call(tool, arguments), loop)
        deadline = time.monotonic() + connection.config.tool_timeout + CALL_MARGIN_S
        while True:
            try:
                return future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                pass
            if self._loop is None:  # stopped with the session while the call was out
                future.cancel()
                raise CallFailed(f"MCP server {server!r} was stopped; the call has no result")
            if cancel is not None and cancel.is_set():
                future.cancel()  # the SDK tells the server the request was cancelled
                raise CallFailed("interrupted; the MCP call was cancelled")
            if time.monotonic() > deadline:
                future.cancel()
                raise CallFailed(f"MCP server {server!r} did not answer; the call was abandoned")
