"""Hooks: the user's commands, run at agent events, able to add context or block.

One file per responsibility:

    config.py    the user's and the repository's hooks.json, read and checked
    trust.py     which repositories' hooks files the user trusted, by content hash
    scripts.py   the scripts those hooks name, covered by the same trust (ScriptGuard)
    active.py    which hooks run in a session (trust, sandbox) and what the user is told
    runner.py    running one hook: sandboxed or not, stdin, timeout, process group, caps
    dispatch.py  what each event sends and what a hook's answer does (`Hooks`)
    session.py   `open_hooks`, what the runtime calls

How to write hooks, and how they are confined: docs/HOOKS.md.
"""

from agent.core.hooks.dispatch import Hooks, PromptVerdict, ToolVerdict
from agent.core.hooks.session import open_hooks

__all__ = ["Hooks", "PromptVerdict", "ToolVerdict", "open_hooks"]
