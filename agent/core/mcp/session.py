"""The MCP side of one agent session: config read, servers started, events reported, all stopped.

The runtime (agent/core/runtime.py) calls `open_mcp` while it assembles the
agent and `start()` once the session has started, so the servers' first
events follow `session_started` in the journal; `close()` ends them with
the session. State changes come from the manager's thread and are handed
to the agent's loop, the only place events are emitted.

The SDK (a second or so to import) is loaded only when servers are
configured: a session without any does not pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.core.events import ErrorEvent, Event, McpServer
from agent.core.mcp.config import ConfigProblem, McpConfig, load_config
from agent.core.mcp.status import ServerStatus, State
from tools.base import Registry
from tools.context import ToolContext

if TYPE_CHECKING:
    from agent.core.mcp.catalog import ToolCatalog
    from agent.core.mcp.manager import McpManager

log = logging.getLogger(__name__)


def status_event(status: ServerStatus) -> McpServer:
    state = "starting" if status.state is State.PENDING else status.state.value
    return McpServer(
        server=status.name,
        state=state,  # type: ignore[arg-type]
        transport=status.transport,
        tools=[t.name for t in status.tools] if status.state is State.READY else [],
        reason=status.reason,
        skipped=list(status.skipped),
    )


def problem_event(problem: ConfigProblem) -> Event:
    """A broken entry is that server failing; a broken file is an error of its own."""
    if problem.server is not None:
        return McpServer(server=problem.server, state="failed", reason=problem.describe())
    return ErrorEvent(message=f"MCP config: {problem.describe()}", kind="mcp_config")


@dataclass
class McpSession:
    config: McpConfig
    manager: McpManager
    catalog: ToolCatalog
    emit: Callable[[Event], None]
    loop: asyncio.AbstractEventLoop
    _closed: bool = field(default=False, init=False)

    @property
    def problems(self) -> list[ConfigProblem]:
        return self.config.problems

    def statuses(self) -> list[ServerStatus]:
        return self.manager.statuses()

    def start(self) -> None:
        for problem in self.config.problems:
            self.emit(problem_event(problem))
        self.manager.on_change = self._report
        self.manager.start()

    def _report(self, status: ServerStatus) -> None:
        """From the manager's thread: the event is emitted on the agent's loop."""
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody to tell
            self.loop.call_soon_threadsafe(self._emit_status, status)

    def _emit_status(self, status: ServerStatus) -> None:
        if not self._closed:
            self.emit(status_event(status))

    def close(self) -> None:
        """Stop every server (blocking; call it off the agent's loop)."""
        self._closed = True
        self.manager.stop()


def open_mcp(
    workspace: Path,
    tool_context: ToolContext,
    registry: Registry,
    emit: Callable[[Event], None],
    config: McpConfig | None = None,
) -> McpSession | None:
    """The session's MCP servers (not started), or None when none are configured and
    no config file has a problem to report. Call on the agent's loop."""
    config = config if config is not None else load_config(workspace)
    if not config.servers and not config.problems:
        return None
    from agent.core.mcp.catalog import ToolCatalog
    from agent.core.mcp.manager import McpManager

    manager = McpManager(
        config,
        workspace,
        tool_context.sandbox,
        tool_context.sandbox_settings,
        reserved=registry.names(),
    )
    catalog = ToolCatalog(registry, manager)
    return McpSession(config, manager, catalog, emit, asyncio.get_running_loop())
