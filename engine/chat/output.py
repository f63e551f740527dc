"""Reasoning and tool-call parsing chained for one chat response.

Model text goes through the reasoning parser first; what it calls content
goes through the tool-call parser. Either may be absent. This keeps the
events in the order the model wrote them, which a server streaming SSE
chunks needs and should not have to work out itself.

With both present, reasoning also ends where a tool call begins: Kimi K2.5/
K2.6 and GLM open calls while still inside `<think>`. Such a model may close
its thinking after the calls; that `</think>` is markup, not answer text, so
the first one in the content that follows is dropped.
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
from engine.chat.reasoning import THINK_CLOSE, ReasoningParser
from engine.chat.text_scan import split_at_marker
from engine.chat.tool_parsers.base import ToolParser

ChatEvent = ReasoningDelta | StreamEvent


@dataclass
class ParsedChatMessage:
    content: str
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _LateThinkClose:
    """Removes the first `</think>` from content text that arrives in pieces."""

    def __init__(self) -> None:
        self._held = ""
        self._done = False

    def push(self, text: str) -> str:
        if self._done:
            return text
        split = split_at_marker(self._held + text, (THINK_CLOSE,), final=False)
        if split.marker is None:
            self._held = split.after
            return split.before
        self._done = True
        self._held = ""
        return split.before + split.after

    def flush(self) -> str:
        """Held text that can no longer become the tag (something else came between)."""
        held, self._held = self._held, ""
        return held


class ChatOutputParser:
    """One per response. Pass fresh parser instances; they hold stream state."""

    def __init__(
        self,
        tool_parser: ToolParser | None = None,
        reasoning_parser: ReasoningParser | None = None,
    ) -> None:
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        if tool_parser is not None and reasoning_parser is not None:
            reasoning_parser.end_at_tool_calls(type(tool_parser).start_markers)
        self._late_close = _LateThinkClose()

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
                out.extend(self._after_open_reasoning(self.tool_parser.feed(event.text)))
            else:
                out.append(event)
        if final and self.tool_parser is not None:
            out.extend(self._after_open_reasoning(self.tool_parser.finish()))
            out.append(ContentDelta(self._late_close.flush()))
        return merge_adjacent_deltas(out)

    def _after_open_reasoning(self, events: list[StreamEvent]) -> list[ChatEvent]:
        if self.reasoning_parser is None or not self.reasoning_parser.left_open:
            return list(events)
        out: list[ChatEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out.append(ContentDelta(self._late_close.push(event.text)))
            else:
                out.append(ContentDelta(self._late_close.flush()))
                out.append(event)
        return out

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
