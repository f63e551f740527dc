"""`resident acp`: the ACP agent on this process's stdin and stdout.

Stdout belongs to the protocol: one stray line there (a library's print, a
warning, a child process inheriting it) breaks the client's parser. So the
protocol gets a private copy of the stdout descriptor, and descriptor 1
itself is pointed at stderr before anything else runs: whatever else writes
to "stdout" lands in the client's log of our stderr instead. The process
ends when stdin closes (the editor went away), after closing its sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

from acp import run_agent

from agent.acp.server import ResidentAgent
from agent.core.runtime import RuntimeOptions

log = logging.getLogger(__name__)

# A prompt with embedded files can be large; the SDK's own default.
STDIO_LIMIT_BYTES = 50 * 1024 * 1024


class _WriteProtocol(asyncio.BaseProtocol):
    """Flow control for the protocol's stdout, as asyncio.StreamWriter expects it."""

    def __init__(self) -> None:
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    async def _drain_helper(self) -> None:
        if self._paused:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


def reserve_stdout() -> int:
    """A descriptor for the protocol's output; fd 1 now goes to stderr."""
    sys.stdout.flush()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    return protocol_fd


async def _streams(
    protocol_fd: int,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=STDIO_LIMIT_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    write_protocol = _WriteProtocol()
    pipe = os.fdopen(protocol_fd, "wb", buffering=0)
    transport, _ = await loop.connect_write_pipe(lambda: write_protocol, pipe)
    return reader, asyncio.StreamWriter(transport, write_protocol, None, loop)


async def serve_stdio(options: RuntimeOptions, protocol_fd: int) -> int:
    agent = ResidentAgent(options)
    reader, writer = await _streams(protocol_fd)
    try:
        await run_agent(agent, writer, reader)  # returns when stdin closes
    finally:
        await agent.close()
        with contextlib.suppress(Exception):
            writer.close()
    return 0


def run_acp(options: RuntimeOptions) -> int:
    return asyncio.run(serve_stdio(options, reserve_stdout()))
