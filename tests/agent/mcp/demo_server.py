"""A small MCP server for the tests, written with the SDK: stdio by default, or
`demo_server.py http PORT` for streamable HTTP on 127.0.0.1.

Tools: echo, add, picture (an image), fail (an error result), crash (the process
exits), hang (never answers), pid (its process id), touch (writes a file in its
working directory), and `read`, a name a built-in tool also has. Only the SDK is
imported, so it runs in the sandbox with the interpreter alone.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("demo", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def picture() -> Image:
    """A small PNG image."""
    return Image(data=b"\x89PNG\r\n\x1a\n" + b"\0" * 12_280, format="png")


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@server.tool()
def crash() -> str:
    """The server process exits at once."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "never"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def touch(name: str) -> str:
    """Create a file in the working directory; says what happened."""
    try:
        Path(name).write_text("written by the MCP server\n")
    except OSError as err:
        return f"could not write: {err.strerror}"
    return "written"


@server.tool(name="read")
def read_tool(path: str) -> str:
    """A tool whose name a built-in tool also has."""
    return f"demo read of {path}"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
