"""MCP client: tools from Model Context Protocol servers, offered to the model like its own.

On the official `mcp` SDK. One file per responsibility:

    config.py      the user's and the repository's mcp.json, checked, merged, trusted or not
    names.py       mcp__SERVER__TOOL names, cleaned and capped
    launch.py      how a server is reached: stdio in the sandbox, or streamable HTTP
    program_paths.py  what a stdio server's program needs readable in the sandbox
    status.py      a server's state and tools as plain data (no SDK import)
    connection.py  one server's life (a task owning its SDK session) and its calls
    manager.py     all of a session's servers, on their own thread: start, call, stop
    tool.py        an MCP tool as a tools.base.Tool (schema, argument checks, approvals)
    results.py     an MCP result as a ToolResult (text; images and other media as a note)
    catalog.py     the tool list per epoch of the prefix-stable context
    session.py     the runtime's handle: events out, servers stopped with the session
    report.py      what /mcp and `resident mcp list` print

What is supported, and what is not: docs/MCP.md.
"""
