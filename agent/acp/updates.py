"""The agent's events as ACP `session/update` notifications.

One translator per session, because a tool call's later events (its approval,
its result) refer back to the call by id and the client wants to know the
tool and the diff it was shown. Live, the user's own message is not echoed
(the client drew it when it sent the prompt) and a file change gets its diff
computed from the disk before it runs; replayed (`session/load`), the user's
messages are sent too and diffs come from the journaled results, since the
files have moved on since.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import (
    plan_entry,
    start_tool_call,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    PlanEntryStatus,
    TextContentBlock,
    UsageUpdate,
    UserMessageChunk,
)

from agent.acp.tool_calls import (
    ToolContent,
    output_content,
    parse_arguments,
    preview_content,
    tool_kind,
    tool_locations,
    tool_title,
)
from agent.core.approval_preview import preview
from agent.core.events import (
    ApprovalResolved,
    Compaction,
    ErrorEvent,
    Event,
    PlanProposed,
    ReasoningDeltaEvent,
    SubagentEvent,
    TextDelta,
    TodoUpdated,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    Usage,
    UserMessage,
    parse_event,
)
from agent.core.plan_mode import PROCEED_MODES
from agent.core.todo import TODO_TOOL
from agent.core.tool_runner import ApprovalRequest

SessionUpdate = Any  # one of acp's session update models
# After a plan (plan mode), streamed as the answer already: how to carry it out. The
# client switches the mode itself (session/set_mode), then sends the go-ahead.
PLAN_NOTE = (
    "\n\n---\n*Plan mode: nothing has been changed. To carry out this plan, switch the "
    f"mode to {', '.join(m.label for m in PROCEED_MODES[:-1])} or {PROCEED_MODES[-1].label} "
    "and tell me to go ahead.*\n"
)
# The model's todo list as an ACP plan. Its items carry no priority, so every entry
# is "medium": the order of the list is what says what comes first.
PLAN_STATUS: dict[str, PlanEntryStatus] = {
    "pending": "pending",
    "in_progress": "in_progress",
    "done": "completed",
}
TODO_CALL_TITLE = "Update the todo list"


@dataclass
class _Call:
    name: str
    args: dict[str, Any]
    diff: list[ToolContent] = field(default_factory=list)  # the change it would make


class UpdateTranslator:
    def __init__(self, workspace: Path, *, replay: bool = False) -> None:
        self.workspace = workspace
        self.replay = replay
        self._calls: dict[str, _Call] = {}
        self.last_finish_reason: str | None = None  # of the last model request

    def call_content(self, call_id: str) -> list[ToolContent]:
        """The diff or command a pending call shows (for its permission request)."""
        call = self._calls.get(call_id)
        return list(call.diff) if call is not None else []

    def open_calls(self) -> list[str]:
        """Calls started and not finished, oldest first."""
        return list(self._calls)

    def revise(self, call_id: str, content: list[ToolContent]) -> list[SessionUpdate]:
        """A better preview of a pending call (from the editor's text): the update that
        shows it; its result will show it too."""
        call = self._calls.get(call_id)
        if call is None or not content:
            return []
        call.diff = list(content)
        return [update_tool_call(call_id, content=content)]

    def __call__(self, event: Event) -> list[SessionUpdate]:
        if isinstance(event, TextDelta):
            return [update_agent_message_text(event.text)] if event.text else []
        if isinstance(event, ReasoningDeltaEvent):
            return [update_agent_thought_text(event.text)] if event.text else []
        if isinstance(event, UserMessage):
            return [update_user_message_text(event.text)] if self.replay else []
        if isinstance(event, ToolCallEvent):
            return [self._start(event)]
        if isinstance(event, ApprovalResolved) and event.approved:
            return [update_tool_call(event.id, status="in_progress")]
        if isinstance(event, ToolResultEvent):
            return [self._finish(event)]
        if isinstance(event, Usage):
            used = event.prompt_tokens + event.completion_tokens
            size = max(event.context_window, used)
            return [UsageUpdate(session_update="usage_update", used=used, size=size)]
        if isinstance(event, ErrorEvent):
            return [update_agent_message_text(f"\n\n**Error:** {event.message}\n\n")]
        if isinstance(event, PlanProposed):
            return [] if self.replay else [update_agent_message_text(PLAN_NOTE)]
        if isinstance(event, Compaction):
            note = f"Compacted {event.messages_before} messages of the conversation into a summary."
            return [update_agent_thought_text(note)]
        if isinstance(event, TodoUpdated):
            return [plan_update(event)]
        if isinstance(event, SubagentEvent):
            return self._subagent(event)
        if isinstance(event, TurnCompleted):
            self.last_finish_reason = event.finish_reason
        return []

    def _subagent(self, event: SubagentEvent) -> list[SessionUpdate]:
        """A child's tool calls as calls of their own (ACP has no nesting), titled as the
        subagent's; its text stays out: its report is the task call's result."""
        inner = parse_event(event.event)
        if isinstance(inner, ToolCallEvent):
            start = self._start(inner)
            return [start.model_copy(update={"title": f"Subagent · {start.title}"})]
        if isinstance(inner, ToolResultEvent | ApprovalResolved):
            return self(inner)
        return []

    def _start(self, event: ToolCallEvent) -> SessionUpdate:
        args = parse_arguments(event.arguments)
        call = _Call(event.name, args)
        if not self.replay:
            request = ApprovalRequest(event.id, event.name, "", "", arguments=args)
            call.diff = preview_content(preview(request, self.workspace), self.workspace)
        self._calls[event.id] = call
        todo = event.name == TODO_TOOL  # the plan update that follows shows the list itself
        return start_tool_call(
            event.id,
            TODO_CALL_TITLE if todo else tool_title(event.name, args),
            kind="think" if todo else tool_kind(event.name),
            status="pending",
            content=call.diff or None,
            locations=tool_locations(self.workspace, args),
            raw_input=args,
        )

    def _finish(self, event: ToolResultEvent) -> SessionUpdate:
        call = self._calls.pop(event.id, None) or _Call("", {})
        is_diff = bool(call.diff) and getattr(call.diff[0], "type", "") == "diff"
        if event.ok and is_diff:
            content = call.diff  # the client draws the change itself
        else:
            content = output_content(call.name, event.output, event.data)
        return update_tool_call(
            event.id, status="completed" if event.ok else "failed", content=content
        )


def plan_update(event: TodoUpdated) -> AgentPlanUpdate:
    """The whole list as an ACP `plan` update (the client replaces its plan with it)."""
    return update_plan(
        plan_entry(item.content, priority="medium", status=PLAN_STATUS[item.status])
        for item in event.items
    )


_CHUNKS = (AgentMessageChunk, AgentThoughtChunk, UserMessageChunk)


def _merged(updates: list[SessionUpdate]) -> list[SessionUpdate]:
    """Consecutive text chunks of one kind as one: a replayed answer is one message,
    not the hundreds of deltas it streamed as."""
    merged: list[SessionUpdate] = []
    for update in updates:
        last = merged[-1] if merged else None
        if (
            isinstance(update, _CHUNKS)
            and type(update) is type(last)
            and isinstance(update.content, TextContentBlock)
            and isinstance(last.content, TextContentBlock)
        ):
            text = last.content.text + update.content.text
            merged[-1] = last.model_copy(
                update={"content": TextContentBlock(type="text", text=text)}
            )
        else:
            merged.append(update)
    return merged


def replay_updates(events: list[Event], workspace: Path) -> list[SessionUpdate]:
    """A journaled session as the updates that draw it again, oldest first."""
    translate = UpdateTranslator(workspace, replay=True)
    updates: list[SessionUpdate] = []
    for event in events:
        updates.extend(translate(event))
    # A call the journal never saw finish (the process was killed during it) did not.
    updates.extend(update_tool_call(call_id, status="failed") for call_id in translate.open_calls())
    # Context use is a level, not a history: only the latest one means anything now.
    usage = [u for u in updates if isinstance(u, UsageUpdate)]
    updates = [u for u in updates if not isinstance(u, UsageUpdate)] + usage[-1:]
    # So is the plan: each replaces the whole of the one before.
    plans = [u for u in updates if isinstance(u, AgentPlanUpdate)]
    updates = [u for u in updates if not isinstance(u, AgentPlanUpdate)] + plans[-1:]
    return _merged(updates)
