"""How line-oriented front ends show the event stream: JSON lines, or readable progress.

Shared by `resident run` (headless.py) and the line REPL (repl.py).

`--json` writes every event as one JSON object per line on stdout and nothing
else there, so a script can parse stdout line by line. Without it, progress
(the model's text as it streams, tool calls and their results, approvals,
errors) goes to stderr, and only the final message goes to stdout.

Neither lets a terminal obey what the model wrote: progress shows control
characters and escape sequences as text (`\\x1b[2K`), and JSON lines carry
them as `\\u` escapes, which a JSON reader turns back into the same string.
"""

from __future__ import annotations

import json
from typing import TextIO

from agent.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CheckpointTaken,
    Compaction,
    ContextSnapshot,
    ErrorEvent,
    Event,
    HookRun,
    McpServer,
    PlanProposed,
    ReasoningDeltaEvent,
    SessionStarted,
    SubagentCompleted,
    SubagentEvent,
    SubagentStarted,
    TextDelta,
    TodoUpdated,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    Usage,
)
from agent.core.todo import TODO_MARKS, TODO_TOOL, progress
from agent.core.valid_unicode import model_json
from agent.terminal_text import json_terminal_safe, terminal_safe
from tools.schema import load_arguments

MAX_ARGUMENT_CHARS = 160
MAX_RESULT_LINES = 3


class JsonLinesPrinter:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: Event) -> None:
        self.out.write(json_terminal_safe(model_json(event)) + "\n")
        self.out.flush()


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments(raw: str) -> str:
    try:
        value = load_arguments(raw)
    except ValueError:  # not JSON, or too deeply nested to read safely
        return _short(raw, MAX_ARGUMENT_CHARS)
    if isinstance(value, dict):
        parts = [f"{key}={json.dumps(val, ensure_ascii=False)}" for key, val in value.items()]
        return _short(", ".join(parts), MAX_ARGUMENT_CHARS)
    return _short(raw, MAX_ARGUMENT_CHARS)


class ProgressPrinter:
    """Readable progress on a terminal (or a CI log)."""

    def __init__(self, out: TextIO, show_reasoning: bool = False) -> None:
        self.out = out
        self.show_reasoning = show_reasoning
        self._mid_line = False
        self._todo_calls: set[str] = set()  # todo_write calls whose result the list shows

    # Everything is written through _line and _stream, and both show control characters
    # and escape sequences as text (agent/terminal_text.py): most of it is the model's.
    def _line(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        self.out.write(terminal_safe(text) + "\n")
        self.out.flush()

    def _stream(self, text: str) -> None:
        text = terminal_safe(text)
        self.out.write(text)
        self.out.flush()
        self._mid_line = not text.endswith("\n")

    def _todo(self, event: Event) -> bool:
        """The todo list, printed whole when it changes; its calls stay one short line.
        True when the event was handled here."""
        if isinstance(event, ToolCallEvent) and event.name == TODO_TOOL:
            self._todo_calls.add(event.id)
            self._line(f"→ {TODO_TOOL}")
            return True
        if isinstance(event, ToolResultEvent) and event.id in self._todo_calls:
            self._todo_calls.discard(event.id)
            return event.ok  # an error is printed like any tool's
        if isinstance(event, TodoUpdated):
            items = event.items
            heading = f"[todo {progress(items)}]" if items else "[todo cleared]"
            lines = [
                f"  {TODO_MARKS[item.status]} {terminal_safe(item.content, one_line=True)}"
                for item in items
            ]
            self._line("\n".join([heading, *lines]))
            return True
        return False

    def __call__(self, event: Event) -> None:
        if self._todo(event):
            return
        if isinstance(event, SessionStarted):
            verb = "resumed" if event.resumed else "started"
            self._line(
                f"[session {event.session_id} {verb}: {event.model}, "
                f"{event.context_window:,}-token window, approval {event.approval}]"
            )
        elif isinstance(event, ContextSnapshot):
            what = "repository" if event.mode == "full" else "repository map"
            approx = "" if event.token_count == "tokenizer" else "~"
            self._line(
                f"[epoch {event.epoch}: {what}, {event.files} files in full, "
                f"{approx}{event.tokens:,} tokens resident]"
            )
        elif isinstance(event, TextDelta):
            self._stream(event.text)
        elif isinstance(event, ReasoningDeltaEvent) and self.show_reasoning:
            self._stream(event.text)
        elif isinstance(event, ToolCallEvent):
            self._line(f"→ {event.name}({_arguments(event.arguments)})")
        elif isinstance(event, ApprovalRequested):
            self._line(f"  ? needs approval: {event.request} ({event.reason})")
        elif isinstance(event, ApprovalResolved):
            verdict = "approved" if event.approved else "not approved"
            self._line(f"  {verdict}" + (" (nobody to ask)" if event.by == "unavailable" else ""))
        elif isinstance(event, ToolResultEvent):
            mark = "✓" if event.ok else "✗"
            lines = event.output.strip().splitlines() or [""]
            shown = "\n    ".join(_short(line, 200) for line in lines[:MAX_RESULT_LINES])
            more = (
                f"\n    … ({len(lines) - MAX_RESULT_LINES} more lines)"
                if len(lines) > MAX_RESULT_LINES
                else ""
            )
            self._line(f"  {mark} {shown}{more}")
        elif isinstance(event, CheckpointTaken):
            self._line(f"[checkpoint {event.checkpoint_id}]")
        elif isinstance(event, Compaction):
            self._line(f"[compacted {event.messages_before} messages]")
        elif isinstance(event, Usage):
            cached = "?" if event.cached_tokens is None else f"{event.cached_tokens:,}"
            self._line(
                f"[{event.prompt_tokens:,} prompt tokens ({cached} cached), "
                f"{event.completion_tokens:,} generated, window {event.context_window:,}]"
            )
        elif isinstance(event, ErrorEvent):
            self._line(f"error: {event.message}")
        elif isinstance(event, HookRun):
            self._hook(event)
        elif isinstance(event, McpServer) and event.state == "failed":
            self._line(f"[mcp server {event.server} failed: {event.reason}]")
        elif isinstance(event, McpServer) and event.state == "ready":
            skipped = f"; left out: {'; '.join(event.skipped)}" if event.skipped else ""
            self._line(f"[mcp server {event.server}: {len(event.tools)} tools{skipped}]")
        elif isinstance(event, TurnCompleted) and self._mid_line:
            self._line("")
        elif isinstance(event, SubagentStarted | SubagentEvent | SubagentCompleted):
            self._subagent(event)
        elif isinstance(event, PlanProposed):
            self._line("[plan proposed (plan mode): nothing was changed]")

    def _subagent(self, event: SubagentStarted | SubagentEvent | SubagentCompleted) -> None:
        """A child's work, indented under its `task` call: its tool calls and results and
        its errors; not its streamed text (children run side by side and would interleave
        mid-line), whose gist is the final report, printed when it completes."""
        if isinstance(event, SubagentStarted):
            self._line(f"  ┌ subagent: {event.description} ({event.approval})")
        elif isinstance(event, SubagentCompleted):
            first = event.final_message.strip().splitlines()[:1] or [""]
            turns = f"{event.turns} turn" + ("" if event.turns == 1 else "s")
            self._line(f"  └ subagent {event.reason} ({turns}): {_short(first[0], 160)}")
        else:
            inner = event.event
            kind = inner.get("type")
            if kind == "tool_call":
                self._line(f"  │ → {inner['name']}({_arguments(inner['arguments'])})")
            elif kind == "tool_result":
                lines = str(inner.get("output", "")).strip().splitlines() or [""]
                self._line(f"  │   {'✓' if inner.get('ok') else '✗'} {_short(lines[0], 160)}")
            elif kind == "approval_requested":
                self._line(f"  │   ? needs approval: {inner['request']} ({inner['reason']})")
            elif kind == "error":
                self._line(f"  │ error: {inner['message']}")

    def _hook(self, event: HookRun) -> None:
        """A hook that blocked or added context; one that failed is also an `error` event,
        printed as such, and a quiet success prints nothing."""
        where = f"{event.hook_event} {event.tool}".strip()
        first = event.message.strip().splitlines()[0] if event.message.strip() else ""
        if event.outcome == "blocked":
            self._line(f"[hook {event.name} ({where}) blocked: {_short(first, 200)}]")
        elif event.outcome == "allowed" and event.message:
            self._line(f"[hook {event.name} ({where}) added context: {_short(first, 120)}]")
