"""A `task` call's child over ACP: its calls appear as the client's tool calls, titled as
the subagent's, and its report is the task call's result."""

from __future__ import annotations

from acp.schema import ToolCallProgress, ToolCallStart

from agent.acp.updates import UpdateTranslator
from agent.core.events import (
    SubagentCompleted,
    SubagentEvent,
    SubagentStarted,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)


def nested(event) -> SubagentEvent:
    return SubagentEvent(id="task_1", event=event.model_dump(mode="json"))


def test_a_childs_calls_are_tool_calls_of_their_own(tmp_path):
    translate = UpdateTranslator(tmp_path)
    task_args = '{"description": "find uses of add", "prompt": "Where is add used?"}'
    (task,) = translate(ToolCallEvent(id="task_1", name="task", arguments=task_args))
    assert isinstance(task, ToolCallStart) and task.title == "Subagent: find uses of add"
    assert translate(SubagentStarted(id="task_1", description="x", approval="read-only")) == []
    (start,) = translate(
        nested(ToolCallEvent(id="c1", name="grep", arguments='{"pattern": "add("}'))
    )
    assert isinstance(start, ToolCallStart)
    assert (start.tool_call_id, start.title) == ("c1", "Subagent · Grep add(")
    assert translate(nested(TextDelta(text="thinking aloud"))) == []  # the report says it
    (done,) = translate(nested(ToolResultEvent(id="c1", ok=True, output="calc.py:1")))
    assert isinstance(done, ToolCallProgress) and done.status == "completed"
    completed = SubagentCompleted(id="task_1", reason="done", final_message="r", turns=2)
    assert translate(completed) == []
    (result,) = translate(ToolResultEvent(id="task_1", ok=True, output="add is in calc.py"))
    assert result.tool_call_id == "task_1" and result.status == "completed"
    assert translate.open_calls() == []
