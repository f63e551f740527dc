"""A `task` call's child agent in the TUI: its tool calls fold into the call's block."""

from __future__ import annotations

import asyncio

from textual.pilot import Pilot

from agent.core.events import (
    SubagentCompleted,
    SubagentEvent,
    SubagentStarted,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    TurnStarted,
    Usage,
    UserMessage,
)
from agent.tui.widgets.subagent_log import SubagentLog
from agent.tui.widgets.tool_block import ToolBlock
from tests.agent.tui.helpers import wait_until
from tests.agent.tui.scenes import START, replay_app
from tests.agent.tui.test_snapshots import SIZE, drawn

REPORT = "add is defined in calc.py:1 and used in test_calc.py:5."
TASK_ARGS = '{"description": "find uses of add", "prompt": "Where is add used?"}'


def child(event) -> SubagentEvent:
    return SubagentEvent(id="call_1", event=event.model_dump(mode="json"))


SUBAGENT = [
    *START,
    UserMessage(text="Where is add used?"),
    TurnStarted(turn=1),
    ToolCallEvent(id="call_1", name="task", arguments=TASK_ARGS),
    SubagentStarted(id="call_1", description="find uses of add", approval="read-only"),
    child(ToolCallEvent(id="c1", name="grep", arguments='{"pattern": "add("}')),
    child(ToolResultEvent(id="c1", ok=True, output="calc.py:1\ntest_calc.py:5")),
    child(ToolCallEvent(id="c2", name="read", arguments='{"path": "missing.py"}')),
    child(ToolResultEvent(id="c2", ok=False, output="no such file")),
    SubagentCompleted(id="call_1", reason="done", final_message=REPORT, turns=3),
    ToolResultEvent(id="call_1", ok=True, output=REPORT),
    TurnCompleted(turn=1, finish_reason="tool_calls"),
    TurnStarted(turn=2),
    TextDelta(text="`add` is used once, in test_calc.py."),
    Usage(
        prompt_tokens=1400,
        completion_tokens=30,
        cached_tokens=1300,
        resident_tokens=412,
        context_window=32768,
    ),
    TurnCompleted(turn=2, finish_reason="stop"),
]


def test_the_childs_calls_are_listed_in_the_task_block(tmp_path):
    async def scenario():
        app = replay_app(SUBAGENT, tmp=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await drawn(pilot)
            block = next(b for b in app.query(ToolBlock) if b.tool_name == "task")
            log = block.query_one(SubagentLog)
            return str(block.title), log.calls, block.collapsed, len(app.query(ToolBlock))

    title, calls, collapsed, blocks = asyncio.run(scenario())
    assert "subagent: 3 turns, 2 calls" in title and "find uses of add" in title
    assert [c[:1] + c[2:] for c in calls.values()] == [["grep", "done"], ["read", "failed"]]
    assert collapsed  # folded like any call
    assert blocks == 1  # the child's calls are not blocks of the parent's conversation


def test_subagent_block_unfolded(snap_compare, tmp_path):
    async def unfold(pilot: Pilot) -> None:
        await drawn(pilot)
        block = next(b for b in pilot.app.query(ToolBlock) if b.tool_name == "task")
        block.collapsed = False
        await wait_until(pilot, lambda: block.query_one(SubagentLog).display)
        await pilot.pause(0.2)

    app = replay_app(SUBAGENT, tmp=tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=unfold)


def test_a_childs_approval_is_asked_inside_its_task_block(tmp_path):
    from agent.core.tool_runner import ApprovalRequest
    from agent.tui.widgets.approval import ApprovalPrompt

    asking = SUBAGENT[: SUBAGENT.index(next(e for e in SUBAGENT if e.type == "subagent"))]
    request = ApprovalRequest(
        call_id="c9",  # the child's call: the parent's conversation has no block for it
        tool="write",
        request="Write notes.txt",
        reason="ask mode asks before changing files",
        parent_id="call_1",
    )

    async def scenario():
        app = replay_app(asking, tmp=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.ready and app.query(ToolBlock))
            prompt = await app.conversation.ask(request, None)
            await pilot.pause(0.1)
            block = next(b for b in app.query(ToolBlock) if b.tool_name == "task")
            question = str(prompt.query_one(".question").render())
            return prompt in block.query(ApprovalPrompt), block.collapsed, question

    inside, collapsed, question = asyncio.run(scenario())
    assert inside and not collapsed
    assert question.startswith("Subagent: Write notes.txt")
