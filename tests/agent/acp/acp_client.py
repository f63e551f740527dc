"""An ACP client for the tests, on the SDK's client side, and `resident acp` as its agent.

The client records every update and permission request, answers permission
requests from a list, and plays an editor for fs/read_text_file and
fs/write_text_file: unsaved buffers are served from a dict, writes go to
disk and are recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, spawn_agent_process
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    InitializeResponse,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
    WriteTextFileResponse,
)

ROOT = Path(__file__).resolve().parents[3]
WAIT = "wait"  # a permission answer: never answer (until the turn is cancelled)


class EditorClient:
    def __init__(self, answers: list[str] | None = None, buffers: dict[str, str] | None = None):
        self.answers = list(answers or [])
        self.buffers = dict(buffers or {})  # absolute path -> unsaved text
        self.updates: list[Any] = []
        self.permission_requests: list[Any] = []
        self.reads: list[str] = []
        self.writes: list[tuple[str, str]] = []
        self.asked = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.permission_requests.append((tool_call, options))
        self.asked.set()
        answer = self.answers.pop(0) if self.answers else "reject-once"
        if answer == WAIT:
            await asyncio.Event().wait()  # the agent stops waiting when the turn is cancelled
        if answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=answer)
        )

    async def read_text_file(self, session_id, path, line=None, limit=None, **kwargs):
        self.reads.append(path)
        text = self.buffers.get(path)
        return ReadTextFileResponse(content=Path(path).read_text() if text is None else text)

    async def write_text_file(self, session_id, path, content, **kwargs):
        self.writes.append((path, content))
        self.buffers.pop(path, None)
        Path(path).write_text(content)  # an editor saving the buffer it changed
        return WriteTextFileResponse()

    # -- what arrived --------------------------------------------------------------

    def of(self, kind: type) -> list[Any]:
        return [u for u in self.updates if isinstance(u, kind)]

    def text(self, kind: type = AgentMessageChunk) -> str:
        return "".join(u.content.text for u in self.of(kind))

    def thoughts(self) -> str:
        return self.text(AgentThoughtChunk)

    def user_text(self) -> str:
        return self.text(UserMessageChunk)

    def tool_starts(self) -> list[ToolCallStart]:
        return self.of(ToolCallStart)

    def tool_updates(self) -> list[ToolCallProgress]:
        return self.of(ToolCallProgress)


def capabilities(fs: bool) -> ClientCapabilities:
    return ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs), terminal=False
    )


@dataclass
class Running:
    conn: Any  # the SDK's ClientSideConnection
    process: asyncio.subprocess.Process
    init: InitializeResponse


@asynccontextmanager
async def resident_acp(
    client: EditorClient, url: str | None, cwd: Path, *extra: str, fs: bool = False
) -> AsyncIterator[Running]:
    """`resident acp --attach URL` (no URL: the local engine) as a child process, initialized.

    Leaving closes its stdin, which must end it (the SDK then waits, terminates
    and kills in turn); a process still alive after that is killed by its PID.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    attach = ["--attach", url, "--context-window", "32768"] if url else []
    args = ["-m", "agent.cli", "acp", *attach, *extra]
    with (cwd.parent / "acp-stderr.log").open("ab") as log:
        spawn = spawn_agent_process(
            client,
            sys.executable,
            *args,
            env=env,
            cwd=cwd,
            transport_kwargs={"stderr": log, "shutdown_timeout": 15.0},
        )
        async with spawn as (conn, process):
            init = await asyncio.wait_for(
                conn.initialize(
                    protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities(fs)
                ),
                timeout=60,
            )
            yield Running(conn, process, init)
        if process.returncode is None:
            os.kill(process.pid, signal.SIGKILL)


def stderr_of(cwd: Path) -> str:
    path = cwd.parent / "acp-stderr.log"
    return path.read_text(errors="replace") if path.exists() else ""
