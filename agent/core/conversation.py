"""The conversation after the resident prefix, changed only in whole steps.

Messages are OpenAI-shaped dicts. They are added a turn at a time (`commit`),
never half a turn, so the history is always one a server accepts: every
assistant tool call is followed by its result. Listeners (the session
journal) hear of each change as it happens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Message = dict[str, Any]


class Conversation:
    def __init__(
        self,
        messages: list[Message] | None = None,
        on_append: Callable[[list[Message]], None] | None = None,
        on_reset: Callable[[list[Message]], None] | None = None,
    ) -> None:
        self.messages: list[Message] = list(messages or [])
        self.on_append = on_append
        self.on_reset = on_reset

    def __len__(self) -> int:
        return len(self.messages)

    def commit(self, messages: list[Message]) -> None:
        if not messages:
            return
        self.messages.extend(messages)
        if self.on_append is not None:
            self.on_append(messages)

    def replace(self, messages: list[Message]) -> None:
        """Swap the whole conversation (compaction, undo)."""
        self.messages = list(messages)
        if self.on_reset is not None:
            self.on_reset(self.messages)

    def truncate(self, length: int) -> None:
        """Back to the first `length` messages (undo to a checkpoint)."""
        self.replace(self.messages[:length])
