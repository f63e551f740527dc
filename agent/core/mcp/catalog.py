"""The tools offered to the model, MCP tools included, fixed for each epoch of the context.

The request's tool list is part of the prompt prefix the engine caches
(DESIGN.md §4), so it may only change where the prefix changes anyway: at
a new epoch. `schemas()` is what the context calls when it starts one: it
brings the registry up to date (tools of servers that became ready are
added, those of servers that failed or stopped are taken away) and returns
every schema sorted by name. `version` tells the context that a server has
become ready since, so it starts a new epoch before the next turn; a
server that fails only loses its tools at the next epoch that happens for
other reasons, its calls answering with an error until then, which keeps
the prefix stable.

Before the first turns, `settle()` lets servers that are still starting
finish, up to `STARTUP_GRACE_S` after the session opened, so their tools
are there from the first request when they start quickly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agent.core.mcp.manager import McpManager
from agent.core.mcp.status import State
from agent.core.mcp.tool import McpTool
from tools.base import Registry

log = logging.getLogger(__name__)

STARTUP_GRACE_S = 10.0


class ToolCatalog:
    def __init__(
        self, registry: Registry, manager: McpManager, grace_s: float = STARTUP_GRACE_S
    ) -> None:
        self.registry = registry
        self.manager = manager
        self.grace_s = grace_s
        self._mcp: dict[str, McpTool] = {}

    @property
    def version(self) -> int:
        return self.manager.version

    def schemas(self) -> list[dict[str, Any]]:
        """Sync the registry with the servers now ready; every tool's schema, by name."""
        wanted: dict[str, Any] = {}
        for status in self.manager.statuses():
            if status.state is State.READY:
                for offered in status.tools:
                    wanted[offered.name] = offered
        for name in list(self._mcp):
            if wanted.get(name) != self._mcp[name].offered:
                self.registry.unregister(name)
                del self._mcp[name]
        for name, offered in sorted(wanted.items()):
            if name in self._mcp:
                continue
            if name in self.registry:  # never shadow a tool already there
                log.warning("MCP tool %s skipped: a tool of that name exists", name)
                continue
            tool = McpTool(offered, self.manager)
            self.registry.register(tool)
            self._mcp[name] = tool
        return self.registry.schemas()

    def offered(self) -> list[str]:
        """The MCP tools in the registry now (this epoch's)."""
        return sorted(self._mcp)

    async def settle(self) -> None:
        """Give servers still starting until the grace period ends; never longer."""
        started = self.manager.started_at
        if started is None or not self.manager.starting():
            return
        left = started + self.grace_s - time.monotonic()
        if left > 0:
            await asyncio.to_thread(self.manager.wait_settled, left)
