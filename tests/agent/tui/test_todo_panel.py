"""The todo panel above the input: drawn from `todo_updated` events, emptied by a new
session, shown again on resume; and a snapshot of it in the app."""

from __future__ import annotations

import pytest

from agent.core.events import (
    Event,
    SessionStarted,
    TextDelta,
    TodoItem,
    TodoUpdated,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    TurnStarted,
    Usage,
    UserMessage,
)
from agent.core.todo import TODO_TOOL
from agent.tui.messages import AgentEvent
from agent.tui.widgets.todo_panel import MAX_SHOWN, TodoPanel, window
from agent.tui.widgets.tool_block import ToolBlock
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tests.agent.tui.helpers import make_app, ready, screen_text, send, settle, shows, wait_until
from tests.agent.tui.scenes import START, replay_app
from tests.agent.tui.test_snapshots import SIZE, drawn

PLAN = [
    TodoItem(content="Read calc.py and test_calc.py", status="done"),
    TodoItem(content="Fix add to return a + b", status="in_progress"),
    TodoItem(content="Run the tests", status="pending"),
]
PLAN_ARGS = (
    '{"todos": [{"content": "Read calc.py and test_calc.py", "status": "done"}, '
    '{"content": "Fix add to return a + b", "status": "in_progress"}, '
    '{"content": "Run the tests", "status": "pending"}]}'
)
TODO_SCENE: list[Event] = [
    *START,
    UserMessage(text="Fix add and run the tests."),
    TurnStarted(turn=1),
    TextDelta(text="Three steps; I will track them."),
    ToolCallEvent(id="call_1", name=TODO_TOOL, arguments=PLAN_ARGS),
    TodoUpdated(items=PLAN),
    ToolResultEvent(id="call_1", ok=True, output="Todo list saved (1/3 done)."),
    Usage(
        prompt_tokens=1210,
        completion_tokens=48,
        cached_tokens=1089,
        resident_tokens=412,
        context_window=32768,
    ),
    TurnCompleted(turn=1, finish_reason="tool_calls"),
]


def items(*statuses: str) -> list[TodoItem]:
    return [TodoItem(content=f"step {i}", status=s) for i, s in enumerate(statuses)]  # type: ignore[arg-type]


def test_snapshot_of_the_panel(snap_compare, tmp_path):
    assert snap_compare(replay_app(TODO_SCENE, tmp=tmp_path), terminal_size=SIZE, run_before=drawn)


def test_a_long_list_shows_a_window_around_the_item_in_progress():
    assert window(items(*["pending"] * MAX_SHOWN)) == (0, MAX_SHOWN)
    long = items(*["done"] * 10, "in_progress", *["pending"] * 10)
    assert window(long) == (8, 8 + MAX_SHOWN)  # two done items before it for context
    assert window(items(*["done"] * 20)) == (20 - MAX_SHOWN, 20)  # all done: the end
    assert window(items(*["pending"] * 20)) == (0, MAX_SHOWN)


@pytest.mark.anyio
async def test_the_panel_follows_the_events(tmp_path):
    app = replay_app(START, tmp=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(TodoPanel)
        await pilot.pause()
        assert not panel.display  # no list: no panel
        app.post_message(AgentEvent(TodoUpdated(items=items("done", "in_progress"))))
        await wait_until(pilot, lambda: panel.display, "the panel")
        await shows(pilot, "Todo 1/2", "☑ step 0", "◐ step 1")
        long = items(*["done"] * 10, "in_progress", *["pending"] * 10)
        app.post_message(AgentEvent(TodoUpdated(items=long)))
        await shows(pilot, "Todo 10/21", "⋯ 8 more above", "◐ step 10", "⋯ 5 more below")
        assert "step 7" not in screen_text(app)
        started = START[0]
        assert isinstance(started, SessionStarted)
        app.post_message(AgentEvent(started.model_copy(update={"session_id": "another"})))
        await wait_until(pilot, lambda: not panel.display, "a new session to empty it")


@pytest.mark.anyio
async def test_a_live_list_goes_with_clear_and_comes_back_on_resume(repo, tmp_path):
    plan = [
        {"content": "Read calc.py", "status": "in_progress"},
        {"content": "Fix add", "status": "pending"},
    ]
    script = [Reply("", [call(TODO_TOOL, todos=plan)]), Reply("On it.")]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "fix add")
            await settle(pilot)
            await shows(pilot, "Todo 0/2", "◐ Read calc.py", "☐ Fix add")
            (block,) = app.query(ToolBlock)
            assert block.summary == "updated the todo list, 0/2 done"  # one compact line
            assert block.collapsed
            session_id = app.bridge.session_id()
            await send(pilot, "/clear")
            panel = app.query_one(TodoPanel)
            await wait_until(pilot, lambda: not panel.display, "the panel to go")
        resumed = make_app(server.url, repo, tmp_path, resume=session_id)
        async with resumed.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await shows(pilot, "Todo 0/2", "◐ Read calc.py", "☐ Fix add")
