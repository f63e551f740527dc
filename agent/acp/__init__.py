"""The Agent Client Protocol front end: `resident acp`, for editors (Zed, JetBrains).

A front end like the TUI, the line REPL and headless: it opens runtimes
(agent/core/runtime.py) and translates the agent's events into the protocol,
with no agent logic of its own. The pieces:

- stdio.py        the process: stdout kept for the protocol, the connection, shutdown
- server.py       the ACP methods: initialize, sessions, modes, prompt, cancel
- session.py      one session: its runtime, updates in order, turns and cancelling
- updates.py      events as `session/update` notifications, live and replayed
- tool_calls.py   a tool call's kind, title, locations and content for the client
- permissions.py  approvals as `session/request_permission`, answers remembered
- files.py        the client's fs/read_text_file and fs/write_text_file for the file tools
- prompt.py       prompt content blocks as the task text
- engines.py      the model behind the sessions (attached, or one shared local engine)
"""

from agent.acp.stdio import run_acp

__all__ = ["run_acp"]
