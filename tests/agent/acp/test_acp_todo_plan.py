"""The model's todo list as the ACP `plan` session update: translated, sent live to a
real client, and replayed (only the latest) when a session loads. (Plan *mode* over
ACP is test_acp_plan_mode.py.)"""

from __future__ import annotations

import asyncio

import pytest
from acp import text_block
from acp.schema import AgentPlanUpdate, ToolCallStart

from agent.acp.updates import TODO_CALL_TITLE, UpdateTranslator, replay_updates
from agent.core.events import TodoItem, TodoUpdated, ToolCallEvent, ToolResultEvent, UserMessage
from agent.core.todo import TODO_TOOL
from tests.agent.acp.acp_client import EditorClient, resident_acp, stderr_of
from tests.agent.scripted_server import Reply, ScriptedServer, call

TIMEOUT = 60
FIRST = [
    {"content": "Read calc.py", "status": "in_progress"},
    {"content": "Fix add", "status": "pending"},
]
SECOND = [
    {"content": "Read calc.py", "status": "done"},
    {"content": "Fix add", "status": "in_progress"},
]


def entries(update: AgentPlanUpdate) -> list[tuple[str, str, str]]:
    return [(e.content, e.status, e.priority) for e in update.entries]


def updated(todos: list[dict[str, str]]) -> TodoUpdated:
    return TodoUpdated(items=[TodoItem.model_validate(item) for item in todos])


def test_a_list_becomes_a_plan_with_statuses_mapped(tmp_path):
    translate = UpdateTranslator(tmp_path)
    (plan,) = translate(updated(SECOND))
    assert isinstance(plan, AgentPlanUpdate) and plan.session_update == "plan"
    assert entries(plan) == [
        ("Read calc.py", "completed", "medium"),
        ("Fix add", "in_progress", "medium"),
    ]
    (cleared,) = translate(TodoUpdated(items=[]))
    assert cleared.entries == []  # the client empties its plan
    (start,) = translate(ToolCallEvent(id="c1", name=TODO_TOOL, arguments='{"todos": []}'))
    assert isinstance(start, ToolCallStart)
    assert (start.title, start.kind) == (TODO_CALL_TITLE, "think")


def test_a_replay_sends_only_the_latest_plan(tmp_path):
    events = [
        UserMessage(text="fix add"),
        ToolCallEvent(id="c1", name=TODO_TOOL, arguments="{}"),
        updated(FIRST),
        ToolResultEvent(id="c1", ok=True, output="saved"),
        ToolCallEvent(id="c2", name=TODO_TOOL, arguments="{}"),
        updated(SECOND),
        ToolResultEvent(id="c2", ok=True, output="saved"),
    ]
    plans = [u for u in replay_updates(events, tmp_path) if isinstance(u, AgentPlanUpdate)]
    assert [entries(p)[0][1] for p in plans] == ["completed"]


@pytest.mark.anyio
async def test_the_client_receives_the_plan_live_and_on_load(repo):
    live = EditorClient()
    script = [
        Reply("", [call(TODO_TOOL, todos=FIRST)]),
        Reply("", [call(TODO_TOOL, todos=SECOND)]),
        Reply("Reading done; fixing next."),
    ]
    with ScriptedServer(script) as server:
        # Read-only mode: keeping the list needs no permission there either.
        async with resident_acp(live, server.url, repo, "--approval", "read-only") as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            response = await asyncio.wait_for(
                agent.conn.prompt(session_id=session.session_id, prompt=[text_block("fix add")]),
                TIMEOUT,
            )
        loading = EditorClient()
        async with resident_acp(loading, server.url, repo) as agent:
            await asyncio.wait_for(
                agent.conn.load_session(
                    cwd=str(repo), session_id=session.session_id, mcp_servers=[]
                ),
                TIMEOUT,
            )
    assert response.stop_reason == "end_turn", stderr_of(repo)
    assert live.permission_requests == []
    plans = live.of(AgentPlanUpdate)
    assert [entries(p) for p in plans] == [
        [("Read calc.py", "in_progress", "medium"), ("Fix add", "pending", "medium")],
        [("Read calc.py", "completed", "medium"), ("Fix add", "in_progress", "medium")],
    ]
    assert [s.title for s in live.tool_starts()] == [TODO_CALL_TITLE] * 2
    assert [u.status for u in live.tool_updates()] == ["completed"] * 2
    (replayed,) = loading.of(AgentPlanUpdate)
    assert entries(replayed) == entries(plans[-1])
