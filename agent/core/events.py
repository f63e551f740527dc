"""The agent's event stream (DESIGN.md §2): one pydantic model per event type.

The loop emits these in order; headless `--json` prints each as one JSON
line, the TUI renders them, and the session journal stores them. Every event
has a `type` (its discriminator) and a `seq` that increases by one per event
within a session, resumed runs included.

Beyond the list in DESIGN.md there are three events a journal needs to be
complete: `user_message` (what the user asked), `checkpoint` (taken before
the first change of a task, what `/undo` goes back to) and `compaction`;
and `mcp_server`, an MCP server's state changes (agent/core/mcp/);
`hook`, one hook's run (agent/core/hooks/);
`todo_updated`, the model's todo list (agent/core/todo.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str
    seq: int = 0  # set by the EventEmitter


class SessionStarted(Event):
    type: Literal["session_started"] = "session_started"
    session_id: str
    model: str
    workspace: str
    approval: str
    context_window: int
    resumed: bool = False
    # What confines shell commands: "bubblewrap 0.11.0 (system: /usr/bin/bwrap)",
    # or "none: <why>" (every shell command then asks).
    sandbox: str = ""


class UserMessage(Event):
    type: Literal["user_message"] = "user_message"
    text: str


class TurnStarted(Event):
    type: Literal["turn_started"] = "turn_started"
    turn: int  # counts model requests within the task, from 1


# The model's streamed output as events: text_delta, reasoning_delta, tool_call (and
# error of kind tool_call). Each comes from one word of the engine's vocabulary for
# streamed output; agent/core/clients/base.py holds the whole mapping. A class that
# would share that vocabulary's name ends in Event (ReasoningDeltaEvent), as
# ToolCallEvent and ToolResultEvent do beside tools' own classes.


class TextDelta(Event):
    """Answer text (the engine's ContentDelta)."""

    type: Literal["text_delta"] = "text_delta"
    text: str


class ReasoningDeltaEvent(Event):
    """Thinking text (the engine's ReasoningDelta)."""

    type: Literal["reasoning_delta"] = "reasoning_delta"
    text: str


class ToolCallEvent(Event):
    type: Literal["tool_call"] = "tool_call"
    id: str
    name: str
    arguments: str  # as the model sent them: may be invalid, which the tool_result says


class ApprovalRequested(Event):
    type: Literal["approval_requested"] = "approval_requested"
    id: str  # the tool call's id
    name: str
    request: str  # what the call would do, in words a person can approve
    reason: str  # why the policy asks


class ApprovalResolved(Event):
    type: Literal["approval_resolved"] = "approval_resolved"
    id: str
    approved: bool
    # "user" answered; "unavailable": nobody could be asked (headless).
    by: Literal["user", "unavailable"]
    message: str = ""


class ToolResultEvent(Event):
    type: Literal["tool_result"] = "tool_result"
    id: str
    ok: bool
    output: str
    truncated: bool = False
    data: dict[str, Any] = {}


class CheckpointTaken(Event):
    type: Literal["checkpoint"] = "checkpoint"
    checkpoint_id: str
    history_length: int  # conversation messages before the task's first change


class Usage(Event):
    type: Literal["usage"] = "usage"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None  # None: the server did not say
    resident_tokens: int  # the snapshot block's share of the prompt
    context_window: int


class ContextSnapshot(Event):
    type: Literal["context_snapshot"] = "context_snapshot"
    epoch: int
    files: int  # files shown in full
    tokens: int
    mode: Literal["full", "map"]
    omitted: int = 0  # files left out (by rules, or only named in the map)
    token_count: Literal["tokenizer", "estimate"] = "tokenizer"


class Compaction(Event):
    type: Literal["compaction"] = "compaction"
    messages_before: int
    tokens_before: int
    summary: str


class McpServer(Event):
    """An MCP server changed state: starting, ready (with its tools), failed (with why)."""

    type: Literal["mcp_server"] = "mcp_server"
    server: str
    state: Literal["starting", "ready", "failed", "stopped"]
    transport: str = ""  # stdio or http
    tools: list[str] = []  # the names the model is offered (ready)
    reason: str = ""  # why it failed or stopped
    skipped: list[str] = []  # tools left out (name collisions), each with why


class HookRun(Event):
    """One hook ran (agent/core/hooks/): what it was run for and what came of it."""

    type: Literal["hook"] = "hook"
    name: str  # the entry's "name", else the start of its command
    hook_event: Literal["session_start", "user_prompt", "pre_tool", "post_tool", "stop"]
    command: str
    source: Literal["user", "repository"]
    # allowed: exit 0; blocked: exit 2 (the call, prompt or stop was refused, or, at
    # post_tool, its stderr went to the model); warning: another exit, a failure to start;
    # timeout: killed at its timeout.
    outcome: Literal["allowed", "blocked", "warning", "timeout"]
    duration_s: float
    message: str = ""  # the reason (blocked), what went wrong, or the context it added
    tool: str = ""  # pre_tool and post_tool: the tool and the call's id
    call_id: str = ""


class ErrorEvent(Event):
    type: Literal["error"] = "error"
    message: str
    # approval, transient, client, engine, context, internal, tool_call, max_turns
    kind: str
    fatal: bool = False


class TurnCompleted(Event):
    type: Literal["turn_completed"] = "turn_completed"
    turn: int
    # stop, tool_calls, length, interrupted, error
    finish_reason: str


class PlanProposed(Event):
    """A task in plan mode ended with an answer: that answer is the plan, for the user to
    approve (carry on in another mode) or refine (agent/core/plan_mode.py)."""

    type: Literal["plan_proposed"] = "plan_proposed"
    text: str


class SessionCompleted(Event):
    type: Literal["session_completed"] = "session_completed"
    final_message: str
    exit_code: int


class SubagentStarted(Event):
    """The `task` tool started a child agent; its events follow as `subagent` events."""

    type: Literal["subagent_started"] = "subagent_started"
    id: str  # the parent's tool call id: every event of this child names it
    description: str
    approval: str  # the child's approval mode


class SubagentEvent(Event):
    """One event of a child agent, nested under the parent's call: `event` is the child's
    own event (its own `type` and `seq`), exactly as its stream would print it."""

    type: Literal["subagent"] = "subagent"
    id: str
    event: dict[str, Any]


class SubagentCompleted(Event):
    type: Literal["subagent_completed"] = "subagent_completed"
    id: str
    reason: str  # done, max_turns, approval, interrupted, failed (a TaskOutcome's reason)
    final_message: str
    turns: int
    # The child's first request: its prompt and how much of it the cache already held.
    first_prompt_tokens: int | None = None
    first_cached_tokens: int | None = None


class TodoItem(BaseModel):
    """One entry of the model's todo list (agent/core/todo.py)."""

    model_config = ConfigDict(extra="forbid")

    content: str
    status: Literal["pending", "in_progress", "done"]


class TodoUpdated(Event):
    """The model rewrote its todo list (the `todo_write` tool): the whole list, in order.
    The last one in a journal is the list a resumed session starts with."""

    type: Literal["todo_updated"] = "todo_updated"
    items: list[TodoItem] = []


AnyEvent = Annotated[
    SessionStarted
    | UserMessage
    | TurnStarted
    | TextDelta
    | ReasoningDeltaEvent
    | ToolCallEvent
    | ApprovalRequested
    | ApprovalResolved
    | ToolResultEvent
    | CheckpointTaken
    | Usage
    | ContextSnapshot
    | Compaction
    | McpServer
    | HookRun
    | ErrorEvent
    | TurnCompleted
    | PlanProposed
    | SessionCompleted
    | SubagentStarted
    | SubagentEvent
    | SubagentCompleted
    | TodoUpdated,
    Field(discriminator="type"),
]
log = logging.getLogger(__name__)
_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)


def parse_event(data: str | bytes | dict[str, Any]) -> Event:
    """An event from its JSON (a journal line) or its dict."""
    if isinstance(data, dict):
        return _ADAPTER.validate_python(data)
    return _ADAPTER.validate_json(data)


EventSink = Callable[[Event], None]


class EventEmitter:
    """Numbers events and hands them to every sink, in order.

    A sink that raises does not stop the others or the agent: a broken
    display must not lose the journal.
    """

    def __init__(self, sinks: list[EventSink] | None = None, next_seq: int = 1) -> None:
        self.sinks: list[EventSink] = list(sinks or [])
        self.next_seq = next_seq

    def add_sink(self, sink: EventSink) -> None:
        self.sinks.append(sink)

    def emit(self, event: Event) -> Event:
        event.seq = self.next_seq
        self.next_seq += 1
        for sink in self.sinks:
            try:
                sink(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, event.type)
        return event
