"""What the chat-output parsers emit, and how a stream of it folds into one message.

Streaming parsers turn model text into events; `collect_events` folds a whole
event stream into the message a non-streaming response returns. The complete
parsers are defined as exactly that fold, so a streamed response and a
non-streamed one can never disagree.

These are the words for streamed model output everywhere, not only here: the
server writes them as OpenAI, Anthropic or Responses chunks, and the agent's
clients stream the same classes (text, reasoning, complete `ToolCall`s,
`ToolCallError`); agent/core/clients/base.py maps them to the agent's events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ContentDelta:
    """Plain assistant text (OpenAI `delta.content`)."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Thinking text (the `reasoning_content` field of vLLM/SGLang/DeepSeek APIs)."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One piece of a streamed tool call, shaped like OpenAI's `delta.tool_calls[i]`.

    The first delta of a call carries `id` and `name` and empty `arguments`;
    every later delta carries only argument text. The argument texts of one
    index concatenate to the call's complete JSON arguments.
    """

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The `delta.tool_calls` entry an OpenAI streaming client expects."""
        function: dict[str, Any] = {"arguments": self.arguments}
        entry: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            entry["id"] = self.id
            entry["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        entry["function"] = function
        return entry


@dataclass(frozen=True)
class ToolCallEnd:
    """The call at `index` is complete and its arguments are valid JSON.

    OpenAI streaming has no such chunk; servers may ignore it. It tells a
    consumer that the call's arguments will not grow any more.
    """

    index: int


@dataclass(frozen=True)
class ToolCallError:
    """A malformed tool call. Its raw text follows as a `ContentDelta` (for Kimi,
    without the special-token markers, which never belong in text).

    `index` names an already announced call (a `ToolCallDelta` with that index
    was emitted) that is now void; it is None when nothing was announced.
    """

    message: str
    index: int | None = None


StreamEvent = ContentDelta | ToolCallDelta | ToolCallEnd | ToolCallError


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str

    def to_openai(self) -> dict[str, Any]:
        """The `message.tool_calls` entry of a non-streaming OpenAI response."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        }


@dataclass
class ParsedMessage:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def collect_events(events: Iterable[StreamEvent]) -> ParsedMessage:
    """Fold a tool-parser event stream into the complete message.

    Only calls that reached `ToolCallEnd` become tool calls: a voided call
    (`ToolCallError` with its index) or one still open is left out, so a
    malformed call never appears among the tool calls.
    """
    content: list[str] = []
    errors: list[str] = []
    started: dict[int, tuple[str, str, list[str]]] = {}
    ended: list[int] = []
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ToolCallDelta):
            if event.id is not None and event.name is not None:
                started[event.index] = (event.id, event.name, [event.arguments])
            elif event.index in started:
                started[event.index][2].append(event.arguments)
        elif isinstance(event, ToolCallEnd):
            ended.append(event.index)
        elif isinstance(event, ToolCallError):
            errors.append(event.message)
            if event.index is not None:
                started.pop(event.index, None)
    calls = [
        ToolCall(id=started[i][0], name=started[i][1], arguments_json="".join(started[i][2]))
        for i in ended
        if i in started
    ]
    return ParsedMessage(content="".join(content), tool_calls=calls, errors=errors)


def merge_adjacent_deltas(events: list[Any]) -> list[Any]:
    """Join neighbouring deltas of the same kind into one event.

    Parsers emit text in whatever pieces their state machine produced; one
    event per piece would only make more SSE chunks for the same text. Content
    joins content, reasoning joins reasoning, and argument text joins argument
    text of the same call (a call's first delta, with its id and name, stays
    apart).
    """
    merged: list[Any] = []
    for event in events:
        if isinstance(event, ContentDelta | ReasoningDelta) and not event.text:
            continue
        previous = merged[-1] if merged else None
        if isinstance(event, ContentDelta | ReasoningDelta) and type(previous) is type(event):
            merged[-1] = type(event)(previous.text + event.text)
        elif (
            isinstance(event, ToolCallDelta)
            and isinstance(previous, ToolCallDelta)
            and event.id is None
            and previous.id is None
            and event.index == previous.index
        ):
            merged[-1] = ToolCallDelta(event.index, previous.arguments + event.arguments)
        else:
            merged.append(event)
    return merged
