"""Messages from the agent's thread to the TUI (Textual messages: posting them is thread-safe)."""

from __future__ import annotations

from textual.message import Message

from agent.core.approval_preview import Preview
from agent.core.engine_facts import EngineFacts
from agent.core.events import Event
from agent.core.tool_runner import ApprovalRequest


class AgentEvent(Message):
    """One event of the agent's stream, as the journal and headless runs see it."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class History(Message):
    """A resumed session's earlier events, to draw before its new ones."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events


class ApprovalNeeded(Message):
    """A tool call waits for the user; answer it through the bridge."""

    def __init__(self, request: ApprovalRequest, preview: Preview) -> None:
        super().__init__()
        self.request = request
        self.preview = preview


class EngineInfo(Message):
    def __init__(self, facts: EngineFacts) -> None:
        super().__init__()
        self.facts = facts
