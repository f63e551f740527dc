"""A child agent's work inside its `task` call's block: one line per tool call it makes.

The block itself stays folded like any tool call; its heading counts the
child's calls as they happen, and unfolding it shows them, each with its
state, above the child's final report (the block's output).
"""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widgets import Static

from agent.core.events import SubagentCompleted, SubagentEvent, SubagentStarted
from agent.tui.format import call_summary, short

MARKS = {
    "running": ("●", "$text-accent"),
    "pending": ("◌", "$text-warning"),
    "done": ("✓", "$text-success"),
    "failed": ("✗", "$text-error"),
}


class SubagentLog(Static):
    DEFAULT_CSS = """
    SubagentLog { height: auto; padding: 0 0 0 1; color: $text-muted; }
    """

    def __init__(self, started: SubagentStarted) -> None:
        super().__init__("")
        self.description = started.description
        self.approval = started.approval
        self.calls: dict[str, list[str]] = {}  # call id -> [name, summary, state]
        self.errors: list[str] = []
        self._refresh()

    def record(self, event: SubagentEvent) -> None:
        inner: dict[str, Any] = event.event
        kind = inner.get("type")
        entry = self.calls.get(str(inner.get("id", "")))
        if kind == "tool_call":
            summary = call_summary(inner["name"], inner.get("arguments", ""), limit=60)
            self.calls[inner["id"]] = [inner["name"], summary, "running"]
        elif kind == "approval_requested" and entry is not None:
            entry[2] = "pending"
        elif kind == "tool_result" and entry is not None:
            entry[2] = "done" if inner.get("ok") else "failed"
        elif kind == "error":
            self.errors.append(short(str(inner.get("message", "")), 100))
        else:
            return
        self._refresh()

    def progress(self) -> str:
        return f"subagent: {self._count()}"

    def finished(self, event: SubagentCompleted) -> str:
        """The heading's detail once the child is done."""
        turns = f"{event.turns} turn" + ("" if event.turns == 1 else "s")
        reason = "" if event.reason == "done" else f"{event.reason}, "
        return f"subagent: {reason}{turns}, {self._count()}"

    def _count(self) -> str:
        return f"{len(self.calls)} call" + ("" if len(self.calls) == 1 else "s")

    def _refresh(self) -> None:
        lines: list[Content] = [
            Content.assemble((f"subagent ({self.approval}): {self.description}", "italic"))
        ]
        for name, summary, state in self.calls.values():
            mark, style = MARKS[state]
            lines.append(Content.assemble((mark, style), " ", (name, "bold"), " ", summary))
        lines += [Content.assemble(("error: ", "$text-error"), text) for text in self.errors]
        self.update(Content("\n").join(lines))
