"""An ACP prompt (content blocks) as the one text message the agent takes.

Editors send what the user typed as text blocks, with @-mentions of files in
between as resource links (and, when the agent says it takes embedded
context, as embedded resources carrying the text). Mentions become the
file's path, relative to the workspace when inside it, so the model can read
it with its tools; embedded text comes along whole. Images, audio and binary
resources are not taken (the capabilities say so); a client that sends them
anyway gets an error, not a silently shortened prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from acp import RequestError
from acp.schema import (
    EmbeddedResourceContentBlock,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
)


def _shown_path(uri: str, workspace: Path) -> str:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return uri
    path = Path(unquote(parsed.path))
    try:
        return path.relative_to(workspace).as_posix()
    except ValueError:
        return str(path)


def prompt_text(blocks: Sequence[Any], workspace: Path) -> str:
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"`{_shown_path(block.uri, workspace)}`")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(
            block.resource, TextResourceContents
        ):
            name = _shown_path(block.resource.uri, workspace)
            parts.append(f"\n\n`{name}`:\n```\n{block.resource.text.rstrip()}\n```\n\n")
        else:
            kind = getattr(block, "type", type(block).__name__)
            raise RequestError.invalid_params(
                {"prompt": f"{kind} content is not supported; send text or text resources"}
            )
    text = "".join(parts).strip()
    if not text:
        raise RequestError.invalid_params({"prompt": "the prompt has no text"})
    return text
