"""An MCP tool's answer as a tool result: text for the model, a note for what is not text.

The model reads text only, so text blocks are joined; an image, audio clip
or binary resource becomes a one-line note saying what was there (its type
and size), never its base64, which would only fill the context. Structured
content is shown as JSON when the server sent no text for it. A result the
server marked `isError` is an error result; output over the cap keeps its
head and tail, like a shell command's.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import mcp_types as types

from agent.core.valid_unicode import valid_text
from tools.base import ToolResult
from tools.process.output_cap import HeadTailBuffer

NO_OUTPUT = "(the tool returned no content)"


def _size(data: str) -> str:
    try:
        raw = len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        raw = len(data) * 3 // 4
    if raw < 1024:
        return f"{raw} bytes"
    if raw < 1024 * 1024:
        return f"{raw / 1024:.0f} KB"
    return f"{raw / 1024 / 1024:.1f} MB"


def _block(block: Any) -> tuple[str, str | None]:
    """(text for the model, the kind of a non-text block or None)."""
    if isinstance(block, types.TextContent):
        return block.text, None
    if isinstance(block, types.ImageContent):
        return f"[image: {block.mime_type}, {_size(block.data)}]", "image"
    if isinstance(block, types.AudioContent):
        return f"[audio: {block.mime_type}, {_size(block.data)}]", "audio"
    if isinstance(block, types.ResourceLink):
        mime = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.uri}{mime}]", "resource_link"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}", None
        mime = resource.mime_type or "binary"
        return f"[resource {resource.uri}: {mime}, {_size(resource.blob)}]", "resource"
    kind = getattr(block, "type", type(block).__name__)
    return f"[{kind} content]", str(kind)


def convert(result: types.CallToolResult, output_limit: int) -> ToolResult:
    parts: list[str] = []
    kinds: list[str] = []
    for block in result.content:
        text, kind = _block(block)
        parts.append(text)
        if kind:
            kinds.append(kind)
    if not any(p.strip() for p in parts) and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False, indent=1)]
    text = "\n".join(parts) if parts else NO_OUTPUT
    buffer = HeadTailBuffer(output_limit)
    buffer.feed(valid_text(text).encode("utf-8"))  # a lone surrogate: U+FFFD
    output = buffer.render()
    data: dict[str, Any] = {"mcp": True}
    if kinds:
        data["non_text"] = kinds
    if result.is_error:
        return ToolResult(ok=False, output=output, truncated=buffer.truncated, data=data)
    return ToolResult(ok=True, output=output, truncated=buffer.truncated, data=data)
