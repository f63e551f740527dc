"""Reading an OpenAI chat-completions stream: SSE lines in, stream items out.

Pure functions over text, so every oddity servers produce can be tested
without a network: comments and `event:` lines, chunks without choices
(the final usage chunk), tool-call deltas whose id and name arrive first and
whose arguments arrive in pieces, `reasoning_content` (vLLM, SGLang,
DeepSeek) or `reasoning` (newer vLLM), and errors sent inside the stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.core.clients.base import (
    BadResponseError,
    ClientError,
    Completion,
    ContentDelta,
    ContextOverflowError,
    ReasoningDelta,
    StreamItem,
    TokenUsage,
    ToolCall,
    TransientError,
)

DONE = "[DONE]"


def sse_data(line: str) -> str | None:
    """The payload of a `data:` line; None for other SSE lines (comments, event names)."""
    if not line.startswith("data:"):
        return None
    data = line[5:]
    return data[1:] if data.startswith(" ") else data


def parse_usage(raw: Any) -> TokenUsage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    try:
        return TokenUsage(
            prompt_tokens=int(raw.get("prompt_tokens") or 0),
            completion_tokens=int(raw.get("completion_tokens") or 0),
            cached_tokens=int(cached) if cached is not None else None,
        )
    except (TypeError, ValueError):
        return None


def error_from_payload(error: Any, status: int | None = None) -> ClientError:
    """An OpenAI-style error object as the matching client error."""
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        code = str(error.get("code") or error.get("type") or "")
    else:
        message, code = str(error), ""
    text = f"the server reported an error: {message}"
    lowered = (message + " " + code).lower()
    if "context" in lowered and ("length" in lowered or "window" in lowered or "long" in lowered):
        return ContextOverflowError(text)
    if status in (429, 502, 503, 504) or "overloaded" in lowered:
        return TransientError(text)
    return ClientError(text)


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class ChatStreamDecoder:
    """Folds the chunks of one streamed response; call `feed_line` per line, then `finish`."""

    calls: dict[int, _PendingCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: TokenUsage | None = None
    done: bool = False
    chunks: int = 0

    def feed_line(self, line: str) -> list[StreamItem]:
        data = sse_data(line.rstrip("\r"))
        if data is None or self.done:
            return []
        if data.strip() == DONE:
            self.done = True
            return []
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested absurdly deep
            raise BadResponseError(
                f"the server sent a stream event that is not JSON: {data[:200]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise BadResponseError(
                f"the server sent a stream event that is not an object: {data[:200]!r}"
            )
        return self.feed_chunk(chunk)

    def feed_chunk(self, chunk: dict[str, Any]) -> list[StreamItem]:
        if "error" in chunk:
            raise error_from_payload(chunk["error"])
        self.chunks += 1
        usage = parse_usage(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        items: list[StreamItem] = []
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            if usage is None:
                raise BadResponseError(f"a stream chunk has no choices: {json.dumps(chunk)[:200]}")
            return items
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n > 1 is never requested; ignore what we did not ask for
            delta = choice.get("delta") or choice.get("message") or {}
            items.extend(self._delta(delta))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return items

    def _delta(self, delta: dict[str, Any]) -> list[StreamItem]:
        items: list[StreamItem] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            items.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            items.append(ContentDelta(content))
        for position, call in enumerate(delta.get("tool_calls") or []):
            if not isinstance(call, dict):
                continue
            index = call.get("index", position)
            key = index if isinstance(index, int) else position
            pending = self.calls.setdefault(key, _PendingCall())
            if call.get("id"):
                pending.id = str(call["id"])
            function = call.get("function") or {}
            if function.get("name") and not pending.name:
                pending.name = str(function["name"])
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                pending.arguments.append(arguments)
            elif isinstance(arguments, dict):  # some servers send the object itself
                pending.arguments.append(json.dumps(arguments))
        return items

    def finish(self, fallback_id: str = "call") -> list[StreamItem]:
        """The complete tool calls and the `Completion`. Raises when the stream was cut."""
        if not self.done and self.finish_reason is None:
            if self.calls:
                raise TransientError("the stream ended in the middle of a tool call")
            raise TransientError("the stream ended before the response was complete")
        items: list[StreamItem] = []
        for index in sorted(self.calls):
            call = self.calls[index]
            items.append(
                ToolCall(
                    id=call.id or f"{fallback_id}_{index}",
                    name=call.name,
                    arguments_json="".join(call.arguments),
                )
            )
        reason = self.finish_reason or ("tool_calls" if self.calls else "stop")
        items.append(Completion(finish_reason=reason, usage=self.usage))
        return items


def decode_complete_response(body: dict[str, Any]) -> list[StreamItem]:
    """A non-streamed chat completion (a server that ignored `stream`), as stream items."""
    decoder = ChatStreamDecoder()
    items = decoder.feed_chunk(body)
    decoder.done = True
    return items + decoder.finish()
