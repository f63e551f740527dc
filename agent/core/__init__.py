"""The agent's core: the loop, its runtime, the resident context, sessions, tools and clients.

Front ends live beside it (agent/tui, agent/repl.py, agent/headless.py,
agent/acp) and reach it through `runtime.open_runtime`, the `Agent` it
returns, the typed events it emits and the slash commands in `commands`;
none of them holds agent logic. The core knows no front end: it never
imports one, prints nothing and chooses no process exit code.
"""
