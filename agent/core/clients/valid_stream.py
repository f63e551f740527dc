"""A model's stream as valid Unicode (agent/core/valid_unicode.py): where the text
the model writes enters the agent.

Every reader of `LLMClient.stream` in the agent (the loop, compaction) reads it
through `valid_stream`, whatever the client: text, reasoning, tool-call ids,
names and arguments, problems and the finish reason come out with each lone
surrogate as U+FFFD, so no event, journal line or later request can fail on
one. A text or reasoning chunk that ends in a high surrogate keeps it back for
the next chunk of its kind: a pair split across two chunks is joined, and one
left alone is U+FFFD.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

from agent.core.clients.base import (
    Completion,
    ContentDelta,
    ReasoningDelta,
    StreamItem,
    ToolCall,
    ToolCallError,
)
from agent.core.valid_unicode import (
    REPLACEMENT,
    is_high_surrogate,
    valid_arguments,
    valid_text,
)


async def valid_stream(items: AsyncIterator[StreamItem]) -> AsyncIterator[StreamItem]:
    """`items` with all their text valid Unicode. Closing this stream closes `items`
    (the request is aborted, as when `items` is closed itself)."""
    held: ContentDelta | ReasoningDelta | None = None  # a chunk's trailing high surrogate
    try:
        async for item in items:
            if isinstance(item, ContentDelta | ReasoningDelta):
                text = item.text
                if held is not None and type(held) is type(item):
                    text, held = held.text + text, None
                if held is not None:
                    yield type(held)(REPLACEMENT)
                    held = None
                if text and is_high_surrogate(text[-1]):
                    held, text = type(item)(text[-1]), text[:-1]
                if text:
                    text = valid_text(text)
                    yield item if text == item.text else type(item)(text)
                continue
            if held is not None:
                yield type(held)(REPLACEMENT)
                held = None
            yield mended(item)
        if held is not None:
            yield type(held)(REPLACEMENT)
    finally:
        close = getattr(items, "aclose", None)
        if close is not None:
            with contextlib.suppress(RuntimeError):  # already running: it is closing
                await close()


def mended(item: StreamItem) -> StreamItem:
    """One stream item with its text valid Unicode; the item itself when it was."""
    if isinstance(item, ContentDelta | ReasoningDelta):
        text = valid_text(item.text)
        return item if text is item.text else type(item)(text)
    if isinstance(item, ToolCall):
        fields = {
            "id": valid_text(item.id),
            "name": valid_text(item.name),
            "arguments_json": valid_arguments(item.arguments_json),
        }
    elif isinstance(item, ToolCallError):
        fields = {"message": valid_text(item.message)}
    elif isinstance(item, Completion):
        fields = {"finish_reason": valid_text(item.finish_reason)}
    else:
        return item
    if all(value is getattr(item, name) for name, value in fields.items()):
        return item
    return dataclasses.replace(item, **fields)
