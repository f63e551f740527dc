"""Tool names the model sees for MCP tools: `mcp__SERVER__TOOL`, always valid, never shadowing.

Model APIs accept tool names of letters, digits, `_` and `-`, at most 64
characters. Server and tool names are whatever their authors chose, so they
are cleaned to that alphabet; a name that would be too long keeps a short
hash of the original so two long names stay apart. Runs of underscores in a
server's part fold to one, so `__` only ever separates the three parts and a
rule naming `mcp__SERVER` covers exactly that server's tools.
"""

from __future__ import annotations

import hashlib
import re

PREFIX = "mcp"
SEPARATOR = "__"
MAX_NAME = 64
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def clean(text: str) -> str:
    return _NOT_ALLOWED.sub("_", text) or "_"


def server_part(server: str) -> str:
    """The server's name as it appears in tool names and rules."""
    return re.sub(r"_{2,}", "_", clean(server))


def server_prefix(server: str) -> str:
    return f"{PREFIX}{SEPARATOR}{server_part(server)}"


def tool_name(server: str, tool: str) -> str:
    """`mcp__SERVER__TOOL`, cleaned and capped at 64 characters."""
    name = f"{server_prefix(server)}{SEPARATOR}{clean(tool)}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha1(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - len(digest) - 1]}_{digest}"
