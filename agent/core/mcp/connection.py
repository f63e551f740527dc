"""One MCP server's connection: a task that owns the SDK session from start to stop.

The SDK's transports and sessions are anyio context managers that must be
entered and left by the same task, so one task per server (`run`) holds
them for the server's life: it connects, lists the tools, reports ready,
then waits until the session stops it or the server goes away. Calls are
made from other tasks on the same loop; the session multiplexes them.

Whatever goes wrong costs this server only: a startup past its timeout, a
command that cannot start, a server that exits or drops the connection all
end in state `failed` with a reason (the last lines the server wrote on
stderr included, where they say why); a call past its timeout is an error
for that call, and the server stays up for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from agent.core.mcp.config import ServerConfig
from agent.core.mcp.launch import LaunchRefused, open_transport, sandbox_label
from agent.core.mcp.names import tool_name
from agent.core.mcp.status import OfferedTool, ServerStatus, State
from tools.sandbox.grants import CommandSandbox, SandboxSettings

if sys.version_info >= (3, 11):
    from builtins import BaseExceptionGroup
else:  # anyio brings the backport there
    from exceptiongroup import BaseExceptionGroup

MAX_TOOL_PAGES = 50
MAX_DESCRIPTION = 2000  # characters of a tool's description the model sees
STDERR_TAIL = 600  # characters of the server's stderr quoted in a failure reason
CLIENT_INFO = types.Implementation(name="resident", version="0.1.0")


class CallFailed(Exception):
    """A call that got no result from the server; the message is for the model."""


def _offer(
    server: str, tools: list[types.Tool], reserved: set[str]
) -> tuple[tuple[OfferedTool, ...], tuple[str, ...]]:
    """The tools under their namespaced names, sorted; the ones left out and why."""
    offered: dict[str, OfferedTool] = {}
    skipped: list[str] = []
    for tool in sorted(tools, key=lambda t: t.name):
        name = tool_name(server, tool.name)
        if name in reserved:
            skipped.append(f"{tool.name}: its name {name} is a built-in tool's")
            continue
        if name in offered:
            skipped.append(f"{tool.name}: named {name} like {offered[name].original!r}")
            continue
        schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
        description = (tool.description or tool.title or tool.name).strip()
        offered[name] = OfferedTool(
            name=name,
            server=server,
            original=tool.name,
            description=description[:MAX_DESCRIPTION],
            input_schema=schema,
        )
    return tuple(offered[n] for n in sorted(offered)), tuple(skipped)


def _tail(errlog: IO[str] | None) -> str:
    """The last lines the server wrote on stderr, read without moving the shared offset."""
    if errlog is None:
        return ""
    try:
        fd = errlog.fileno()
        size = os.fstat(fd).st_size
        raw = os.pread(fd, STDERR_TAIL * 4, max(0, size - STDERR_TAIL * 4))
    except (OSError, ValueError):
        return ""
    text = raw.decode("utf-8", errors="replace").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()][-4:]
    return " | ".join(lines)[-STDERR_TAIL:]


def _describe(err: BaseException) -> str:
    """A failure in words; an exception group is reduced to the first real error in it."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    if isinstance(err, OSError) and err.strerror:
        name = f"{err.filename}: " if err.filename else ""
        return f"could not start it: {name}{err.strerror}"
    if isinstance(err, MCPError):
        if err.code == types.CONNECTION_CLOSED:
            return "the server closed the connection before it was ready (it exited?)"
        return f"the server answered with an error: {err.message}"
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class ServerConnection:
    def __init__(
        self,
        config: ServerConfig,
        workspace: Path,
        sandbox: CommandSandbox | None,
        settings: SandboxSettings,
        reserved: set[str],
        on_change: Callable[[ServerStatus], None],
    ) -> None:
        self.config = config
        self.workspace = workspace
        self.sandbox = sandbox
        self.settings = settings
        self.reserved = reserved
        self.on_change = on_change
        self.status = ServerStatus(
            name=config.name,
            transport=config.transport,
            source=config.source,
            target=config.target,
            sandbox=sandbox_label(config, sandbox, settings),
            notes=config.notes,
        )
        self.client: Client | None = None
        # asyncio's events bind to a loop when first awaited, so they may be made here.
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._stopping = False
        self._ended = False
        self._startup: anyio.CancelScope | None = None

    def _set(self, state: State, reason: str = "", **changes: Any) -> None:
        self.status = replace(self.status, state=state, reason=reason, **changes)
        self.on_change(self.status)

    def _on_end(self) -> None:
        self._ended = True
        self._wake.set()

    def stop(self) -> None:
        """Ask the owner task to end the server (call on the manager's loop)."""
        self._stopping = True
        self._wake.set()
        if self._startup is not None and self.status.state is State.STARTING:
            self._startup.cancel()  # a server still starting is not waited for

    async def wait_done(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout)

    async def run(self) -> None:
        """The server's life, from start to stop; never raises."""
        if self._stopping:  # stopped before it started
            self._set(State.STOPPED, "stopped with the session")
            self._done.set()
            return
        self._set(State.STARTING)
        timeout = self.config.startup_timeout
        errlog: IO[str] | None = None
        try:
            if self.config.transport == "stdio":
                errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
            with anyio.CancelScope() as scope:
                self._startup = scope
                scope.deadline = anyio.current_time() + timeout
                await self._serve(scope, errlog)
            starting = self.status.state is State.STARTING
            if scope.cancelled_caught and starting and not self._stopping:
                self._fail(f"did not start within {timeout:g}s", errlog)
        except LaunchRefused as err:
            self._set(State.FAILED, str(err))
        except Exception as err:  # any failure of one server stays with that server
            self._fail(_describe(err), errlog)
        finally:
            self.client = None
            self._startup = None
            if self.status.state in (State.STARTING, State.READY):
                if self._stopping:
                    self._set(State.STOPPED, "stopped with the session")
                else:
                    self._fail("the connection ended", errlog)
            if errlog is not None:
                errlog.close()
            self._done.set()

    async def _serve(self, scope: anyio.CancelScope, errlog: IO[str] | None) -> None:
        transport = open_transport(
            self.config, self.workspace, self.sandbox, self.settings, errlog, self._on_end
        )
        async with AsyncExitStack() as stack:
            client = Client(
                transport, read_timeout_seconds=self.config.startup_timeout, client_info=CLIENT_INFO
            )
            await stack.enter_async_context(client)
            tools = await self._list_tools(client)
            scope.deadline = math.inf  # started: only a stop or the server's end from here
            offered, skipped = _offer(self.config.name, tools, self.reserved)
            self.client = client
            if self._stopping:
                return
            self._set(State.READY, tools=offered, skipped=skipped)
            await self._wake.wait()
            if self._ended and not self._stopping:
                self.client = None
                self._fail("the server closed the connection (it exited?)", errlog)

    async def _list_tools(self, client: Client) -> list[types.Tool]:
        if client.session.server_capabilities is not None:
            if client.session.server_capabilities.tools is None:
                return []  # a server without tools (resources or prompts only)
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    def _fail(self, reason: str, errlog: IO[str] | None) -> None:
        if self.status.state in (State.FAILED, State.STOPPED):
            return
        tail = _tail(errlog)
        self._set(State.FAILED, f"{reason} (stderr: {tail})" if tail else reason)

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One tool call. Raises CallFailed with a message for the model."""
        client = self.client
        if client is None or self.status.state is not State.READY:
            raise CallFailed(self._unavailable())
        timeout = self.config.tool_timeout
        try:
            return await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except MCPError as err:
            if err.code == types.REQUEST_TIMEOUT:
                raise CallFailed(
                    f"MCP server {self.config.name!r} did not answer within {timeout:g}s; the "
                    "call was cancelled (the server is still up)"
                ) from None
            if err.code == types.CONNECTION_CLOSED:
                await self.wait_done(5.0)  # let the owner record why
                raise CallFailed(self._unavailable()) from None
            raise CallFailed(
                f"MCP server {self.config.name!r} refused the call: {err.message}"
            ) from None
        except ValidationError as err:
            raise CallFailed(
                f"MCP server {self.config.name!r} sent a malformed result: "
                f"{err.error_count()} problem(s), first: {err.errors()[0]['msg']}"
            ) from None

    def _unavailable(self) -> str:
        status = self.status
        if status.state is State.FAILED:
            return f"MCP server {status.name!r} failed: {status.reason}"
        if status.state is State.STOPPED:
            return f"MCP server {status.name!r} is stopped"
        return f"MCP server {status.name!r} is not ready ({status.state.value})"
