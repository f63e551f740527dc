"""Running one tool call the model asked for: validate, judge, ask, checkpoint, run, report.

Every call ends in exactly one `tool_result` event and one tool message for
the conversation, whatever happens: malformed arguments, an unknown tool, a
policy denial, a person saying no, nobody there to ask, an interrupt. The
model always learns what became of its call, and the history never holds a
call without its result.

Before the first call of a task that may change files (a write, an edit or
a command that is not known to only read) a checkpoint is taken, so `/undo`
brings files and conversation back together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core import clients
from agent.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CheckpointTaken,
    ErrorEvent,
    EventEmitter,
    ToolResultEvent,
)
from agent.core.hooks import Hooks
from agent.core.valid_unicode import valid_json, valid_text
from tools import (
    CheckpointStore,
    Effect,
    PermissionPolicy,
    Registry,
    RestoreReport,
    ToolCall,
    ToolContext,
    ToolResult,
    Verdict,
)
from tools.schema import load_arguments


@dataclass(frozen=True)
class ApprovalRequest:
    call_id: str
    tool: str
    request: str  # what the call would do
    reason: str  # why the policy asks
    arguments: dict[str, Any] = field(default_factory=dict)
    parent_id: str = ""  # a subagent's call: the id of the `task` call that started it
    # A change to Resident's configuration: approved for this call alone, never
    # remembered for the session (tools.permissions.config_zone).
    once: bool = False


@dataclass(frozen=True)
class ApprovalAnswer:
    approved: bool
    message: str = ""  # a person's note for the model ("use the test target instead")


# None means nobody can be asked (headless runs): the task stops with exit code 3.
ApprovalCallback = Callable[[ApprovalRequest], Awaitable[ApprovalAnswer | None]]


@dataclass
class CallOutcome:
    message: dict[str, Any]  # the tool message for the conversation
    result: ToolResult
    needs_unavailable_approval: str | None = None  # what could not be approved


def history_arguments(raw: str) -> str:
    """Arguments as they may stay in the history: a JSON object, or `{}` when the model
    sent something else (kept out so no later request carries invalid JSON), or something
    too long or too deeply nested to read (tools.schema.load_arguments)."""
    try:
        value = load_arguments(raw) if raw.strip() else {}
    except ValueError:
        return "{}"
    return raw if isinstance(value, dict) else "{}"


def tool_message(call_id: str, result: ToolResult) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": result.output}


class ToolRunner:
    def __init__(
        self,
        registry: Registry,
        tool_context: ToolContext,
        policy: PermissionPolicy,
        emitter: EventEmitter,
        approve: ApprovalCallback | None = None,
        checkpoints: CheckpointStore | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.registry = registry
        self.ctx = tool_context
        self.policy = policy
        self.emitter = emitter
        self.approve = approve
        self.checkpoints = checkpoints
        self.hooks = hooks  # pre_tool and post_tool hooks; None: no hooks configured
        self.checkpoint_taken = False  # reset at the start of each task
        # (checkpoint id, conversation length before its task), oldest first: for /undo.
        self.undo_points: list[tuple[str, int]] = []

    @property
    def workspace(self) -> Path:
        return self.ctx.workspace

    def start_task(self) -> None:
        self.checkpoint_taken = False
        self.ctx.cancel_event.clear()

    def cancel(self) -> None:
        """Stop what the running tool does (a shell command is killed)."""
        self.ctx.cancel_event.set()

    async def undo_last_task(self) -> tuple[RestoreReport, int] | None:
        """Files back to the checkpoint before the last task that changed them.

        Returns the restore report and the conversation length before that
        task, or None when this session changed no files."""
        if not self.undo_points or self.checkpoints is None:
            return None
        checkpoint_id, history_length = self.undo_points.pop()
        report = await asyncio.to_thread(self.checkpoints.restore, checkpoint_id)
        self.ctx.file_states.clear()  # what the model read no longer holds
        return report, history_length

    def _finish(self, call_id: str, result: ToolResult, **extra: Any) -> CallOutcome:
        result = _valid_result(result)
        self.emitter.emit(
            ToolResultEvent(
                id=call_id,
                ok=result.ok,
                output=result.output,
                truncated=result.truncated,
                data=_jsonable(result.data),
            )
        )
        return CallOutcome(tool_message(call_id, result), result, **extra)

    def runs_concurrently(self, chunk: clients.ToolCall) -> bool:
        """A valid call of a tool that allows it and that only reads: it may run
        alongside its neighbours in the same answer."""
        parsed = self.registry.parse(chunk.name, chunk.arguments_json, chunk.id)
        if isinstance(parsed, ToolResult):
            return False
        return parsed.tool.concurrent and parsed.access.effect is Effect.READ

    def skip(self, chunk: clients.ToolCall, why: str) -> CallOutcome:
        """A call that will not run (the task stopped before it)."""
        return self._finish(chunk.id, ToolResult.error(f"Not run: {why}."))

    async def run(self, chunk: clients.ToolCall, history_length: int) -> CallOutcome:
        parsed = self.registry.parse(chunk.name, chunk.arguments_json, chunk.id)
        if isinstance(parsed, ToolResult):
            return self._finish(chunk.id, parsed)
        decision = self.policy.check(parsed)
        if decision.verdict is Verdict.DENY:
            return self._finish(
                chunk.id,
                ToolResult.error(
                    f"Denied by the permission policy: {decision.reason}. The call was not run; "
                    "do not retry it unchanged."
                ),
            )
        # pre_tool hooks see only calls the policy lets through, and run before a person
        # is asked, so nobody approves a call a hook would block.
        hook_notes: tuple[str, ...] = ()
        if self.hooks is not None:
            verdict = await self.hooks.pre_tool(parsed.name, _hook_arguments(parsed), chunk.id)
            if verdict.blocked is not None:
                return self._finish(chunk.id, ToolResult.error(verdict.blocked))
            hook_notes = verdict.notes
        if decision.verdict is Verdict.ASK:
            answer = await self._ask(
                parsed, chunk.id, decision.request, decision.reason, decision.once
            )
            if answer is None:
                why = f"{decision.request} needs approval ({decision.reason})"
                result = ToolResult.error(
                    f"Not run: this call needs the user's approval ({decision.reason}) and "
                    "nobody is available to give it."
                )
                return self._finish(chunk.id, result, needs_unavailable_approval=why)
            if not answer.approved:
                note = f" They said: {answer.message}" if answer.message else ""
                return self._finish(
                    chunk.id,
                    ToolResult.error(
                        "The user denied this call; it was not run. Do not retry it unchanged; "
                        f"ask or find another way.{note}"
                    ),
                )
        grant = decision.grant
        if decision.verdict is Verdict.ASK:  # a person approved this very call
            grant = dataclasses.replace(grant, secrets=True)
        await self._checkpoint_before(parsed, history_length)
        result = await self.registry.run_async(parsed, self.ctx, grant)
        if self.hooks is not None:
            result = await self.hooks.post_tool(
                parsed.name, _hook_arguments(parsed), chunk.id, result, hook_notes
            )
        return self._finish(chunk.id, result)

    async def _ask(
        self, call: ToolCall, call_id: str, request: str, reason: str, once: bool = False
    ) -> ApprovalAnswer | None:
        self.emitter.emit(
            ApprovalRequested(id=call_id, name=call.name, request=request, reason=reason)
        )
        answer = None
        if self.approve is not None:
            answer = await self.approve(
                ApprovalRequest(
                    call_id=call_id,
                    tool=call.name,
                    request=request,
                    reason=reason,
                    arguments=call.args.model_dump(),
                    once=once,
                )
            )
        self.emitter.emit(
            ApprovalResolved(
                id=call_id,
                approved=bool(answer and answer.approved),
                by="user" if answer is not None else "unavailable",
                message=answer.message if answer is not None else "",
            )
        )
        return answer

    async def _checkpoint_before(self, call: ToolCall, history_length: int) -> None:
        if self.checkpoint_taken or self.checkpoints is None or call.access.effect is Effect.READ:
            return
        self.checkpoint_taken = True
        store = self.checkpoints
        try:
            checkpoint = await asyncio.to_thread(store.create, f"before {call.access.summary}")
        except Exception as err:  # a failed checkpoint must not block the work; say so
            self.emitter.emit(
                ErrorEvent(
                    message=f"could not take a checkpoint before the first change: {err}",
                    kind="checkpoint",
                )
            )
            return
        self.undo_points.append((checkpoint.id, history_length))
        self.emitter.emit(
            CheckpointTaken(checkpoint_id=checkpoint.id, history_length=history_length)
        )


def _hook_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's checked arguments as JSON values, for a hook's stdin."""
    return _jsonable(call.args.model_dump(mode="json"))


def _valid_result(result: ToolResult) -> ToolResult:
    """The result with its text valid Unicode: a file name that is not UTF-8 (read back
    with surrogateescape) or arguments echoed back hold lone surrogates, which would
    break the event stream and the journals (agent/core/valid_unicode.py)."""
    output, data = valid_text(result.output), valid_json(result.data)
    if output is result.output and data is result.data:
        return result
    return result.model_copy(update={"output": output, "data": data})


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    try:
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        return json.loads(json.dumps(data, default=str))
