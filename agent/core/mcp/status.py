"""What is known about a server at a moment: its state, its tools, why it failed.

Plain data, free of the SDK, so what reports on servers (events, /mcp) loads
without it; the SDK is imported only where a server is actually started.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class State(str, Enum):
    PENDING = "pending"  # configured, not started yet
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class OfferedTool:
    """An MCP tool as the model is offered it."""

    name: str  # mcp__SERVER__TOOL
    server: str
    original: str  # the server's own name for it
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class ServerStatus:
    """A snapshot of one server, safe to read from any thread."""

    name: str
    transport: str
    source: str
    target: str
    sandbox: str
    state: State = State.PENDING
    reason: str = ""
    tools: tuple[OfferedTool, ...] = ()
    skipped: tuple[str, ...] = ()  # tools left out, each with why
    notes: tuple[str, ...] = ()  # what of the config was not honoured

    @property
    def ready(self) -> bool:
        return self.state is State.READY
