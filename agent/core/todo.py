"""The model's todo list: a checklist it keeps while it works, and the user watches.

The `todo_write` tool takes the whole list each time, as Claude Code's
TodoWrite and Codex's update_plan do: for a small model, restating a short
list is easier than addressing single items by id, and a list that arrives
whole is checked whole. The list is session state the runtime owns
(`TodoList`); every change is a `todo_updated` event, so the journal keeps
it, `--resume` restores the last one and every front end draws it from the
event stream alone.

The tool changes nothing but the agent's own state, so its effect is READ:
every approval mode allows it (read-only and plan mode too), and it takes no
checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from agent.core.events import Event, TodoItem, TodoUpdated
from tools import Arguments, Effect, Tool, ToolAccess, ToolCall, ToolContext, ToolResult
from tools.sandbox.grants import SandboxGrant

TODO_TOOL = "todo_write"
MAX_TODO_ITEMS = 50
MAX_TODO_CHARS = 200
# How front ends mark an item (the TUI panel, the headless progress printer).
TODO_MARKS = {"pending": "☐", "in_progress": "◐", "done": "☑"}

TodoListener = Callable[[Event], None]


class TodoEntryArgs(Arguments):
    content: str = Field(max_length=MAX_TODO_CHARS, description="One line.")
    status: Literal["pending", "in_progress", "done"] = Field(
        description="in_progress: doing it now."
    )

    @field_validator("content")
    @classmethod
    def _one_line(cls, value: str) -> str:
        # One line: the panel and the printer show each item on one row.
        text = " ".join(value.split())
        if not text:
            raise ValueError("the item is empty; say what the step is")
        return text


class TodoWriteArgs(Arguments):
    todos: list[TodoEntryArgs] = Field(
        max_length=MAX_TODO_ITEMS,
        description="The whole list, in order; [] clears it.",
    )

    @model_validator(mode="after")
    def _one_in_progress(self) -> TodoWriteArgs:
        doing = [item.content for item in self.todos if item.status == "in_progress"]
        if len(doing) > 1:
            raise ValueError(
                f"{len(doing)} items are in_progress ({'; '.join(doing)}); at most one may "
                "be: mark the one you are doing now in_progress, the others pending or done"
            )
        return self

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return _inline_definitions(super().model_json_schema(*args, **kwargs))


def progress(items: Sequence[TodoItem]) -> str:
    """How far the list is, e.g. "2/5 done"."""
    done = sum(1 for item in items if item.status == "done")
    return f"{done}/{len(items)} done"


def latest_todos(events: Iterable[Event]) -> list[TodoItem]:
    """The list as the last `todo_updated` of a session left it; [] when it has none."""
    items: list[TodoItem] = []
    for event in events:
        if isinstance(event, TodoUpdated):
            items = list(event.items)
    return items


def describe_for_model(items: Sequence[TodoItem], changed: bool) -> str:
    """The tool's result: the list as stored, short, in the words of the tool's schema."""
    if not items:
        return "Todo list cleared." if changed else "Todo list is empty."
    verb = "saved" if changed else "unchanged"
    lines = [f"Todo list {verb} ({progress(items)}):"]
    lines += [f"[{item.status}] {item.content}" for item in items]
    return "\n".join(lines)


def todo_reminder(items: Sequence[TodoItem]) -> str:
    """The list for the model after a compaction, which took the calls that wrote it."""
    if not items:
        return ""
    lines = [f"Your todo list ({TODO_TOOL}) as you left it, {progress(items)}:"]
    lines += [f"[{item.status}] {item.content}" for item in items]
    return "\n".join(lines)


class TodoList:
    """The session's todo list. `listener` (the runtime's event emitter) hears every
    change as a `todo_updated` event; setting the list to what it already is is none."""

    def __init__(self, listener: TodoListener | None = None) -> None:
        self.listener = listener
        self._items: list[TodoItem] = []
        # The list as each task of this process found it, by the conversation's length
        # then: `/undo` goes back to before a task, and the list goes back with it.
        self._at_task_start: dict[int, list[TodoItem]] = {}

    def mark_task_start(self, history_length: int) -> None:
        self._at_task_start[history_length] = self.items

    def back_to(self, history_length: int) -> None:
        """The list as it was when the task that began at `history_length` started
        (`/undo`); unchanged when that task ran before this process (a resumed session)."""
        if history_length in self._at_task_start:
            self.replace(self._at_task_start[history_length])
        self._at_task_start = {k: v for k, v in self._at_task_start.items() if k < history_length}

    @property
    def items(self) -> list[TodoItem]:
        return list(self._items)

    def replace(self, items: Sequence[TodoItem]) -> bool:
        """Set the whole list; True when it changed (and the change was announced)."""
        new = [item.model_copy() for item in items]
        if new == self._items:
            return False
        self._items = new
        if self.listener is not None:
            self.listener(TodoUpdated(items=self.items))
        return True

    def restore(self, events: Iterable[Event]) -> None:
        """The list a resumed session's journal ends with, set without an event: the
        journal and the front ends' history already hold it."""
        self._items = latest_todos(events)


class TodoWriteTool(Tool):
    name = TODO_TOOL
    description = (
        "Write the checklist the user sees (see Working). Send the whole list each time; "
        "at most one item in_progress: what you are doing now."
    )
    effect = Effect.READ
    Args: ClassVar[type[Arguments]] = TodoWriteArgs

    def __init__(self, todos: TodoList) -> None:
        self.todos = todos

    def access(self, args: Any) -> ToolAccess:
        return ToolAccess(effect=Effect.READ, summary="update the todo list")

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        items = [TodoItem(content=entry.content, status=entry.status) for entry in args.todos]
        changed = self.todos.replace(items)
        done = sum(1 for item in items if item.status == "done")
        return ToolResult.success(
            describe_for_model(items, changed), done=done, total=len(items), changed=changed
        )

    async def run_call(self, call: ToolCall, ctx: ToolContext, grant: SandboxGrant) -> ToolResult:
        # On the agent's own loop, not a worker thread: the list's event is emitted where
        # every other event is, between this call's `tool_call` and its `tool_result`.
        return self.run(call.args, ctx)

    def for_child(self) -> Tool:
        # A subagent may keep a checklist for its own task, but not write the parent's:
        # its list is private (its calls still show in the subagent's own events).
        return TodoWriteTool(TodoList())


def _inline_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    """The item schema written in place instead of a `$ref` to `$defs`: small models
    follow a schema they can read straight through."""
    definitions = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return resolve(definitions[ref.removeprefix("#/$defs/")])
        return {key: resolve(value) for key, value in node.items() if key != "$defs"}

    return resolve(schema)
