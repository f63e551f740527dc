"""The todo_write tool and the session's todo list, without a model: validation, state,
what it is allowed to do, and how `--tools` names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.core.events import Event, TodoItem, TodoUpdated, parse_event
from agent.core.runtime import UnknownToolError, make_registry
from agent.core.todo import (
    MAX_TODO_CHARS,
    MAX_TODO_ITEMS,
    TODO_TOOL,
    TodoList,
    TodoWriteTool,
    latest_todos,
    progress,
)
from tools import (
    ApprovalMode,
    Effect,
    PermissionPolicy,
    Registry,
    ToolCall,
    ToolContext,
    ToolResult,
    Verdict,
)


def registry_with_list() -> tuple[Registry, TodoList, list[Event]]:
    heard: list[Event] = []
    todos = TodoList(heard.append)
    return Registry([TodoWriteTool(todos)]), todos, heard


def items(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"content": content, "status": status} for content, status in pairs]


def write(registry: Registry, arguments, tmp_path: Path) -> ToolResult:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return registry.call(TODO_TOOL, raw, ToolContext(workspace=tmp_path))


def test_a_list_is_stored_announced_and_told_back(tmp_path):
    registry, todos, heard = registry_with_list()
    plan = items(("Read calc.py", "done"), ("Fix add", "in_progress"), ("Run the tests", "pending"))
    result = write(registry, {"todos": plan}, tmp_path)
    assert result.ok
    assert result.output == (
        "Todo list saved (1/3 done):\n[done] Read calc.py\n[in_progress] Fix add\n"
        "[pending] Run the tests"
    )
    assert result.data == {"done": 1, "total": 3, "changed": True}
    assert [item.model_dump() for item in todos.items] == plan
    assert len(heard) == 1 and isinstance(heard[0], TodoUpdated)
    assert [item.model_dump() for item in heard[0].items] == plan


def test_the_same_list_again_is_no_change_and_an_empty_list_clears(tmp_path):
    registry, todos, heard = registry_with_list()
    plan = {"todos": items(("Fix add", "in_progress"))}
    write(registry, plan, tmp_path)
    again = write(registry, plan, tmp_path)
    assert again.ok and again.output.startswith("Todo list unchanged (0/1 done)")
    assert len(heard) == 1  # no event without a change
    cleared = write(registry, {"todos": []}, tmp_path)
    assert cleared.ok and cleared.output == "Todo list cleared."
    assert todos.items == [] and heard[-1] == TodoUpdated(items=[], seq=0)


def test_content_is_one_line_with_its_spaces_collapsed(tmp_path):
    registry, todos, _ = registry_with_list()
    write(registry, {"todos": items(("  Fix\n  the   add\tfunction ", "pending"))}, tmp_path)
    assert todos.items[0].content == "Fix the add function"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"todos": items(("a", "completed"))}, "todos.0.status: Input should be 'pending'"),
        ({"todos": items(("a", "in_progress"), ("b", "in_progress"))}, "2 items are in_progress"),
        ({"todos": items(("", "pending"))}, "todos.0.content: Value error, the item is empty"),
        ({"todos": items(("   \n ", "pending"))}, "the item is empty"),
        ({"todos": items(("x" * (MAX_TODO_CHARS + 1), "pending"))}, "at most 200 characters"),
        ({"todos": items(*[("step", "pending")] * (MAX_TODO_ITEMS + 1))}, "at most 50 items"),
        ({"todos": [{"content": "a"}]}, "todos.0.status: required field is missing"),
        ({"todos": [{"content": "a", "status": "done", "id": 1}]}, "todos.0.id: unknown field"),
        ({"todos": "read the file, then fix it"}, "todos: Input should be a valid list"),
        ({}, "todos: required field is missing"),
        ('{"todos": [{"content": "a", "status": "done"}', "are not valid JSON"),
        ('["a"]', "must be a JSON object"),
    ],
)
def test_bad_lists_are_refused_with_what_was_wrong(tmp_path, arguments, says):
    registry, todos, heard = registry_with_list()
    write(registry, {"todos": items(("Keep me", "pending"))}, tmp_path)
    result = write(registry, arguments, tmp_path)
    assert not result.ok
    assert says in result.output, result.output
    assert '{"todos": array of object}' in result.output  # and the shape it takes
    # The list as it was: a refused call changes nothing and announces nothing.
    assert [item.content for item in todos.items] == ["Keep me"] and len(heard) == 1


def test_the_schema_is_inline_for_small_models():
    schema = TodoWriteTool(TodoList()).schema()["function"]
    text = json.dumps(schema)
    assert "$ref" not in text and "$defs" not in text
    item = schema["parameters"]["properties"]["todos"]["items"]
    assert item["properties"]["status"]["enum"] == ["pending", "in_progress", "done"]
    assert item["required"] == ["content", "status"]
    assert "at most one item in_progress" in schema["description"]


@pytest.mark.parametrize("mode", list(ApprovalMode))
def test_every_mode_allows_it_and_it_reads_only(tmp_path, mode):
    tool = TodoWriteTool(TodoList())
    parsed = Registry([tool]).parse(TODO_TOOL, json.dumps({"todos": items(("a", "pending"))}))
    assert isinstance(parsed, ToolCall)
    assert parsed.access.effect is Effect.READ  # so the runner takes no checkpoint for it
    policy = PermissionPolicy(mode, workspace=tmp_path)
    assert policy.check(parsed).verdict is Verdict.ALLOW, mode
    denied = PermissionPolicy(mode, workspace=tmp_path, deny=[TODO_TOOL])
    assert denied.check(parsed).verdict is Verdict.DENY  # the user's rule still wins


def test_a_subagent_gets_a_list_of_its_own(tmp_path):
    parent_list = TodoList()
    child_tool = TodoWriteTool(parent_list).for_child()
    assert isinstance(child_tool, TodoWriteTool) and child_tool.todos is not parent_list
    Registry([child_tool]).call(
        TODO_TOOL, json.dumps({"todos": items(("child step", "pending"))}), ToolContext(tmp_path)
    )
    assert parent_list.items == []


def test_the_last_update_of_a_journal_is_the_list():
    first = TodoUpdated(items=[TodoItem(content="a", status="pending")])
    last = TodoUpdated(items=[TodoItem(content="a", status="done")])
    journal = [parse_event(e.model_dump_json()) for e in (first, last)]
    assert latest_todos(journal) == last.items
    assert latest_todos([]) == []
    restored = TodoList()
    restored.restore(journal)
    assert restored.items == last.items
    assert progress(restored.items) == "1/1 done"


def test_tools_option_knows_todo_write():
    registry = make_registry(("read", TODO_TOOL))
    assert registry.names() == ["read", TODO_TOOL]
    with pytest.raises(UnknownToolError, match="todo_write"):
        make_registry(("read", "todo"))  # the message lists the tools, todo_write among them
