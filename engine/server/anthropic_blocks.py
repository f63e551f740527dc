"""Parser events folded into Anthropic content blocks, and the stream events that build them.

The chat output parser emits reasoning, content and tool-call deltas in the
order the model wrote them. Anthropic's content is a list of blocks (thinking,
text, tool_use) each streamed as content_block_start, deltas, and
content_block_stop, one block open at a time. `ContentBlocks` turns the
former into the latter and keeps the blocks it built, so a non-streamed
message is the same fold of the same events as a streamed one and the two
cannot disagree.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from typing import Any

from engine.chat import ContentDelta, ReasoningDelta, ToolCallDelta, ToolCallEnd, ToolCallError
from engine.chat.json_limits import loads_bounded

log = logging.getLogger(__name__)


def thinking_signature(thinking: str) -> str:
    """A digest of the thinking text, in the block's `signature` field.

    Anthropic signs thinking so it can verify it when a client sends it back;
    clients (Claude Code among them) keep and return only thinking blocks that
    carry a signature. Nothing here needs verifying, so a digest serves.
    """
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()


def _tool_input(arguments: str) -> dict[str, Any]:
    # The parsers end a call only when its arguments are valid JSON; Anthropic's
    # `input` is an object, and formats that allow a bare value get it wrapped.
    value = loads_bounded(arguments) if arguments.strip() else {}
    return value if isinstance(value, dict) else {"value": value}


class ContentBlocks:
    """One response's blocks: feed parser events, get stream events; `content()` at the end."""

    def __init__(self, parallel_tool_calls: bool = True) -> None:
        self.parallel_tool_calls = parallel_tool_calls
        self._blocks: list[dict[str, Any]] = []
        self._open: int | None = None  # index of the block being streamed
        self._calls: dict[int, int] = {}  # parser call index -> block index
        self._arguments: dict[int, list[str]] = {}  # block index -> argument text
        self._complete: set[int] = set()  # tool_use blocks whose call ended well
        self.made_tool_calls = False

    def feed(self, events: list[Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out += self._text("text", event.text)
            elif isinstance(event, ReasoningDelta):
                out += self._text("thinking", event.text)
            elif isinstance(event, ToolCallDelta):
                out += self._call(event)
            elif isinstance(event, ToolCallEnd):
                block = self._calls.get(event.index)
                if block is not None:
                    self._complete.add(block)
                    self.made_tool_calls = True
                    out += self._close()
            elif isinstance(event, ToolCallError):
                log.info("malformed tool call passed on as text: %s", event.message)
                if event.index is not None and self._calls.get(event.index) == self._open:
                    out += self._close()  # already announced: it ends here, incomplete
        return out

    def finish(self) -> list[dict[str, Any]]:
        out = self._close()
        if not self._blocks:  # clients read content[0]; an empty answer is one empty text block
            out += self._start({"type": "text", "text": ""}) + self._close()
        return out

    def content(self) -> list[dict[str, Any]]:
        """The finished message's content: tool_use blocks only for calls that completed."""
        content = []
        for index, block in enumerate(self._blocks):
            if block["type"] == "tool_use":
                if index not in self._complete:
                    continue
                block = {**block, "input": _tool_input("".join(self._arguments[index]))}
            content.append(block)
        return content

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        self._blocks.append(block)
        self._open = len(self._blocks) - 1
        return [{"type": "content_block_start", "index": self._open, "content_block": dict(block)}]

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        out = []
        block = self._blocks[index]
        if block["type"] == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            out.append({"type": "content_block_delta", "index": index, "delta": delta})
        out.append({"type": "content_block_stop", "index": index})
        return out

    def _text(self, kind: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out = []
        if self._open is None or self._blocks[self._open]["type"] != kind:
            out += self._close()
            out += self._start(
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
        self._blocks[self._open][kind] += text
        delta = {"type": "text_delta", "text": text}
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": text}
        out.append({"type": "content_block_delta", "index": self._open, "delta": delta})
        return out

    def _call(self, event: ToolCallDelta) -> list[dict[str, Any]]:
        out = []
        if event.id is not None:
            if event.index > 0 and not self.parallel_tool_calls:
                return []  # disable_parallel_tool_use: only the first call is answered
            out += self._close()
            out += self._start(
                {"type": "tool_use", "id": event.id, "name": event.name or "", "input": {}}
            )
            self._calls[event.index] = self._open
            self._arguments[self._open] = []
        block = self._calls.get(event.index)
        if block is None or block != self._open or not event.arguments:
            return out
        self._arguments[block].append(event.arguments)
        delta = {"type": "input_json_delta", "partial_json": event.arguments}
        out.append({"type": "content_block_delta", "index": block, "delta": delta})
        return out
