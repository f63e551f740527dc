"""Building a child agent from its parent, running it, and reporting what became of it.

What a child shares with its parent: the model client (on the local engine,
the same engine and its pinned prefix), the frozen resident prefix
(child_context.py), the workspace, sandbox and file-read ledger, the deny
and allow rules, the way approvals are asked. What it has of its own: the
conversation, the approval mode (read-only unless the task may write), its
interrupt, and the tools that keep per-agent state (`Tool.for_child`).

Its events go to the parent's stream wrapped in `subagent` events that name
the parent's call, between `subagent_started` and `subagent_completed`, so a
display can fold them under the call and the session journal keeps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import threading

import prompts
from agent.core.conversation import Conversation
from agent.core.events import (
    Event,
    EventEmitter,
    SubagentCompleted,
    SubagentEvent,
    SubagentStarted,
    Usage,
)
from agent.core.loop import Agent
from agent.core.subagents.arguments import TaskArgs
from agent.core.subagents.child_context import ChildContext
from agent.core.tool_runner import ApprovalAnswer, ApprovalCallback, ApprovalRequest, ToolRunner
from tools import ApprovalMode, Registry, ToolContext, ToolResult

# A child is a side task: it gets fewer turns than a whole session may take.
CHILD_MAX_TURNS = 25
CANCEL_POLL_S = 0.05


class _FirstUsage:
    """Remembers the child's first usage event: the measure of the shared prefix."""

    def __init__(self) -> None:
        self.usage: Usage | None = None

    def __call__(self, event: Event) -> None:
        if self.usage is None and isinstance(event, Usage):
            self.usage = event


def child_registry(parent: Registry) -> Registry:
    """The parent's tools as a child gets them (each tool's `for_child`)."""
    tools = (parent.get(name) for name in parent.names())
    return Registry(child for tool in tools if tool and (child := tool.for_child()) is not None)


def child_mode(parent_mode: ApprovalMode, write: bool) -> ApprovalMode:
    # A write task was already judged as an edit by the parent's policy, so here the
    # parent's mode is one that allows asking for or making changes.
    return parent_mode if write else ApprovalMode.READ_ONLY


def build_child(parent: Agent, call_id: str, args: TaskArgs, ctx: ToolContext) -> Agent:
    def forward(event: Event) -> None:
        parent.emitter.emit(SubagentEvent(id=call_id, event=event.model_dump(mode="json")))

    emitter = EventEmitter([forward])
    policy = copy.copy(parent.tools.policy)
    policy.mode = child_mode(parent.approval_mode, args.write)
    # A plan's research child runs read-only, yet still asks before every web fetch as
    # plan mode does (tools.permissions.web_rules): planning sends nothing out unasked.
    policy.fetches_ask = policy.fetches_ask or parent.approval_mode is ApprovalMode.PLAN
    child_ctx = dataclasses.replace(ctx, cancel_event=threading.Event())
    parent_hooks = parent.tools.hooks
    hooks = (  # a guard hook must hold for delegated calls too
        parent_hooks.for_child(emitter.emit, lambda: policy.mode, child_ctx.cancel_event)
        if parent_hooks is not None
        else None
    )
    runner = ToolRunner(
        child_registry(parent.tools.registry),
        child_ctx,
        policy,
        emitter,
        approve=_asking_as_child(parent.tools.approve, call_id),
        checkpoints=None,  # the parent took one before a write task (its effect is a write)
        hooks=hooks,
    )
    settings = dataclasses.replace(
        parent.settings, max_turns=min(parent.settings.max_turns, CHILD_MAX_TURNS)
    )
    return Agent(
        parent.client, ChildContext(parent.context), runner, emitter, Conversation(), settings
    )


def _asking_as_child(approve: ApprovalCallback | None, call_id: str) -> ApprovalCallback | None:
    """The parent's way of asking, with each request marked as this child's, so a front
    end can show it under the `task` call."""
    if approve is None:
        return None

    async def ask(request: ApprovalRequest) -> ApprovalAnswer | None:
        return await approve(dataclasses.replace(request, parent_id=call_id))

    return ask


async def _interrupt_with_parent(child: Agent, parent_cancel: threading.Event) -> None:
    """The parent's interrupt sets its tool context's cancel event: pass it on."""
    while not parent_cancel.is_set():
        await asyncio.sleep(CANCEL_POLL_S)
    child.interrupt()


async def run_child(parent: Agent, call_id: str, args: TaskArgs, ctx: ToolContext) -> ToolResult:
    child = build_child(parent, call_id, args, ctx)
    first = _FirstUsage()
    child.emitter.add_sink(first)
    parent.emitter.emit(
        SubagentStarted(
            id=call_id, description=args.description, approval=child.approval_mode.value
        )
    )
    task = prompts.load(
        "subagent_task",
        prompt=args.prompt,
        mode="may edit files and run commands" if args.write else "works read-only",
    )
    watcher = asyncio.create_task(_interrupt_with_parent(child, ctx.cancel_event))
    try:
        outcome = await child.run_task(task)
    except asyncio.CancelledError:
        child.interrupt()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    turns = sum(1 for m in child.conversation.messages if m.get("role") == "assistant")
    parent.emitter.emit(
        SubagentCompleted(
            id=call_id,
            reason=outcome.reason,
            final_message=outcome.final_message,
            turns=turns,
            first_prompt_tokens=first.usage.prompt_tokens if first.usage else None,
            first_cached_tokens=first.usage.cached_tokens if first.usage else None,
        )
    )
    if outcome.reason == "done":
        return ToolResult.success(outcome.final_message or "(the subagent gave no answer)")
    return ToolResult.error(
        f"The subagent stopped before finishing ({outcome.reason}): {outcome.final_message}"
    )
