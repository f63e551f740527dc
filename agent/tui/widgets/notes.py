"""One-line notes (session, snapshot, checkpoint, command results) and errors with a next step."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

# What a person can do about each kind of error event (agent/core/events.py ErrorEvent.kind).
NEXT_STEPS = {
    "transient": "The engine did not answer. Resident keeps checking; send the message again "
    "once it is back (↑ recalls it).",
    "authentication": "Restart with the right --api-key (or RESIDENT_API_KEY).",
    "context": "The conversation no longer fits the window: /compact summarizes it, "
    "/clear starts afresh.",
    "compaction": "Try /compact again, or /clear to start a new session.",
    "max_turns": 'The task hit the turn limit; say "continue" to let it go on.',
    "tool_call": "The model wrote a malformed tool call; it has been told and will retry.",
    "checkpoint": "Changes in this task cannot be undone with /undo; commit or copy what matters.",
    "engine": "The local engine failed. Try again; restart with -v for details (the TUI logs to "
    "resident.log in the data directory).",
    "configuration": "Fix the setting named above and restart.",
    "mcp_config": "Fix the MCP servers file named above; /clear starts a session that reads it "
    "again.",
    "hook": "A hook (hooks.json) failed or refused; `resident hooks list` shows your hooks, "
    "docs/HOOKS.md what their exit codes mean.",
    "hook_config": "Fix the hooks file named above; /clear starts a session that reads it again.",
    "hook_trust": "Read the repository's .resident/hooks.json, then run `resident hooks trust` "
    "in it; /clear starts a session that runs them.",
}
DEFAULT_NEXT_STEP = "Try again; if it keeps failing, restart with -v for details."


class Note(Static):
    """A quiet line about what happened."""

    DEFAULT_CSS = """
    Note { height: auto; color: $text-muted; padding: 0 1; }
    Note.-good { color: $text-success; }
    Note.-warning { color: $text-warning; }
    """

    def __init__(self, text: str, kind: str = "", **kwargs) -> None:
        super().__init__(Text(text), **kwargs)
        self.text = text
        if kind:
            self.add_class(f"-{kind}")


class ErrorNote(Static):
    """An error from the agent, inline, with what to do next."""

    DEFAULT_CSS = """
    ErrorNote {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $error;
        background: $error 10%;
    }
    """

    def __init__(self, message: str, kind: str, fatal: bool = False, **kwargs) -> None:
        self.message = message
        self.kind = kind
        self.next_step = NEXT_STEPS.get(kind, DEFAULT_NEXT_STEP)
        text = Text()
        text.append("error" if fatal else "problem", style="bold red")
        text.append(f" ({kind}): {message}\n")
        text.append(self.next_step, style="italic")
        super().__init__(text, **kwargs)
