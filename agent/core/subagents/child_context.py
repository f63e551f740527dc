"""The resident context as a child agent sees it: the parent's prefix, frozen.

A child starts from the parent's system message (system prompt, AGENTS.md,
snapshot block) and tool schemas as they are when it starts, byte for byte,
so its requests extend the prefix the engine already holds. It never renders
a snapshot of its own: a new epoch would cost the whole prefill the child
exists to avoid, and the parent, not the child, decides when the repository
view changes. The token accounting is the parent's (same prefix, same counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.core.clients import ChatRequest
from agent.core.context import ResidentContext, Snapshot


class ChildContext:
    """Duck-types the parts of ResidentContext the agent loop and compaction use."""

    def __init__(self, parent: ResidentContext) -> None:
        self._parent = parent
        self._system = parent.system_message()
        self._tool_schemas = list(parent.tool_schemas)
        self.workspace: Path = parent.workspace
        self.window = parent.window
        self.snapshot: Snapshot | None = parent.snapshot

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return self._tool_schemas

    @property
    def resident_tokens(self) -> int:
        return self._parent.resident_tokens

    @property
    def prefix_tokens(self) -> int:
        return self._parent.prefix_tokens

    def request(
        self,
        conversation: list[dict[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        with_tools: bool = True,
    ) -> ChatRequest:
        return ChatRequest(
            messages=[self._system, *conversation],
            tools=self._tool_schemas if with_tools else [],
            max_tokens=max_tokens,
            temperature=temperature,
            pinned_messages=1,
        )

    def prompt_tokens(self, conversation: list[dict[str, Any]]) -> int:
        return self._parent.prefix_tokens + self._parent.conversation_tokens(conversation)

    def over_compaction_threshold(self, conversation: list[dict[str, Any]]) -> bool:
        return self._parent.over_compaction_threshold(conversation)

    def needs_new_epoch(self) -> bool:
        return False

    def new_epoch(self, task: str = "") -> Snapshot | None:
        """After a compaction: the conversation is the summary, the prefix stays."""
        return self.snapshot

    async def settle_tools(self) -> None:
        return None
