"""Reasoning and tool-call parsing chained for one chat response.

Model text goes through the reasoning parser first; what it calls content
goes through the tool-call parser. Either may be absent. This keeps the
events in the order the model wrote them, which a server streaming SSE
chunks needs and should not have to work out itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.chat.events import (
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCall,
    collect_events,
    merge_adjacent_deltas,
)
from engine.chat.reasoning import ReasoningParser
from engine.chat.tool_parsers.base import ToolParser

ChatEvent = ReasoningDelta | StreamEvent


@dataclass
class ParsedChatMessage:
    content: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ChatOutputParser:
    """One per response. Pass fresh parser instances; they hold stream state."""

    def __init__(
        self,
        tool_parser: ToolParser | None = None,
        reasoning_parser: ReasoningParser | None = None,
    ) -> None:
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser

    def feed(self, delta_text: str) -> list[ChatEvent]:
        if self.reasoning_parser is None:
            return self._through_tools([ContentDelta(delta_text)], final=False)
        return self._through_tools(self.reasoning_parser.feed(delta_text), final=False)

    def finish(self) -> list[ChatEvent]:
        upstream = [] if self.reasoning_parser is None else self.reasoning_parser.finish()
        return self._through_tools(upstream, final=True)

    def _through_tools(self, events: list, final: bool) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        for event in events:
            if isinstance(event, ContentDelta) and self.tool_parser is not None:
                out.extend(self.tool_parser.feed(event.text))
            else:
                out.append(event)
        if final and self.tool_parser is not None:
            out.extend(self.tool_parser.finish())
        return merge_adjacent_deltas(out)

    def parse_complete(self, text: str) -> ParsedChatMessage:
        """Parse a whole output. Uses this instance's parsers: call it once, instead of feed."""
        events = self.feed(text) + self.finish()
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        message = collect_events(e for e in events if not isinstance(e, ReasoningDelta))
        return ParsedChatMessage(
            content=message.content,
            reasoning_content=reasoning or None,
            tool_calls=message.tool_calls,
            errors=message.errors,
        )
