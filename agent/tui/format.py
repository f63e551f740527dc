"""Small text helpers the TUI's widgets share."""

from __future__ import annotations

import json

from agent.core.todo import TODO_TOOL
from tools.schema import load_arguments


def tokens(n: int | None) -> str:
    """1234 -> 1.2k, 1234567 -> 1.23M: short enough for a status bar."""
    if n is None:
        return "?"
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.2f}M"


def short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def arguments(raw: str) -> dict:
    """A tool call's arguments as a dict; {} when the model sent something else."""
    try:
        value = load_arguments(raw) if raw.strip() else {}
    except ValueError:  # not JSON, or too deeply nested to read safely
        return {}
    return value if isinstance(value, dict) else {}


def call_summary(name: str, raw_arguments: str, limit: int = 70) -> str:
    """What a call is about, in a few words: its path, command or pattern."""
    args = arguments(raw_arguments)
    if name == TODO_TOOL:
        return todo_summary(args)
    for key in ("command", "path", "pattern", "query", "ref", "message", "description"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return short(value, limit)
    if args:
        return short(", ".join(f"{k}={json.dumps(v)}" for k, v in args.items()), limit)
    return short(raw_arguments, limit) if raw_arguments.strip() else ""


def todo_summary(args: dict) -> str:
    """A todo_write call in one line: the todo panel shows the list itself."""
    todos = args.get("todos")
    if not isinstance(todos, list):
        return "updated the todo list"
    done = sum(1 for item in todos if isinstance(item, dict) and item.get("status") == "done")
    return f"updated the todo list, {done}/{len(todos)} done"
