"""The turn loop: ask the model, run the tools it calls, repeat until it answers.

One task is one user message. Each turn is one model request: the answer
streams out as `text_delta`/`reasoning_delta` events; if it calls tools they
run one after another (each `tool_call` followed by its approval events and
its `tool_result`) and the next turn starts; an answer without tool calls
ends the task. A turn's messages reach the conversation only when the turn
is complete, so an error or a kill mid-turn leaves the history as it was
before that turn.

`interrupt()` stops generation (the request is aborted) and a running shell
command (its process group is killed); calls not yet run are reported to the
model as not run, partial text is kept and marked, and the task ends with
exit code 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path

import prompts
from agent.core.clients import (
    ClientError,
    Completion,
    ContentDelta,
    ContextOverflowError,
    LLMClient,
    ReasoningDelta,
    ToolCall,
    ToolCallError,
    valid_stream,
)
from agent.core.compaction import CompactionFailed, compact
from agent.core.config import DEFAULTS
from agent.core.context import ResidentContext, Snapshot
from agent.core.conversation import Conversation, Message
from agent.core.events import (
    Compaction,
    ContextSnapshot,
    ErrorEvent,
    EventEmitter,
    PlanProposed,
    ReasoningDeltaEvent,
    TextDelta,
    ToolCallEvent,
    TurnCompleted,
    TurnStarted,
    Usage,
    UserMessage,
)
from agent.core.hooks import Hooks
from agent.core.plan_mode import proposes_plan, task_for_model
from agent.core.todo import TodoList, todo_reminder
from agent.core.tool_runner import ToolRunner, history_arguments
from agent.core.valid_unicode import valid_text
from tools import ApprovalMode, RestoreReport


@dataclass(frozen=True)
class AgentSettings:
    max_turns: int = DEFAULTS.max_turns  # declared in AgentConfig (agent/core/config.py)
    max_tokens: int | None = DEFAULTS.max_tokens  # per answer; None: what the window leaves
    temperature: float | None = None  # None: the server's default (greedy locally)


@dataclass(frozen=True)
class TaskOutcome:
    """How a task ended. Front ends turn it into what they show or exit with
    (agent/exit_codes.py); the core chooses no exit code."""

    final_message: str
    reason: str  # done, max_turns, approval, interrupted, failed, blocked (by a hook)
    error_kind: str | None = None  # for "failed": the client error's kind
    plan: bool = False  # "done" in plan mode: the answer is a plan to approve (plan_mode.py)


@dataclass
class _Answer:
    text: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    completion: Completion | None = None
    interrupted: bool = False


def snapshot_event(snapshot: Snapshot, token_count: str) -> ContextSnapshot:
    return ContextSnapshot(
        epoch=snapshot.epoch,
        files=len(snapshot.files),
        tokens=snapshot.tokens,
        mode=snapshot.mode,
        omitted=len(snapshot.omitted),
        token_count="tokenizer" if token_count == "tokenizer" else "estimate",
    )


class Agent:
    def __init__(
        self,
        client: LLMClient,
        context: ResidentContext,
        tools: ToolRunner,
        emitter: EventEmitter,
        conversation: Conversation,
        settings: AgentSettings | None = None,
    ) -> None:
        self.client = client
        self.context = context
        self.tools = tools
        self.emitter = emitter
        self.conversation = conversation
        self.settings = settings or AgentSettings()
        self.todos: TodoList | None = None  # the session's todo list (runtime.py sets it)
        self._interrupted = asyncio.Event()
        self._turns_since_compaction = 1
        self._call_ids: set[str] = {
            call["id"] for m in conversation.messages for call in m.get("tool_calls") or []
        }

    @property
    def workspace(self) -> Path:
        """The repository this agent works in."""
        return self.tools.workspace

    @property
    def hooks(self) -> Hooks | None:
        """The session's hooks (the tool runner holds them); None: none configured."""
        return self.tools.hooks

    @property
    def approval_mode(self) -> ApprovalMode:
        return self.tools.policy.mode

    @approval_mode.setter
    def approval_mode(self, mode: ApprovalMode) -> None:
        self.tools.policy.mode = mode

    # -- control -------------------------------------------------------------------

    def interrupt(self) -> None:
        """Stop the running task as soon as it is safe. Call from the agent's event loop."""
        self._interrupted.set()
        self.tools.cancel()

    async def compact(self) -> bool:
        """`/compact`: summarize the conversation and start a new epoch. False if it failed."""
        if not self.conversation.messages:
            return False
        before = len(self.conversation)
        tokens_before = self.context.prompt_tokens(self.conversation.messages)
        try:
            summary = await compact(self.client, self.context, self.conversation, self._kept())
        except (ClientError, CompactionFailed) as err:
            self.emitter.emit(ErrorEvent(message=f"compaction failed: {err}", kind="compaction"))
            return False
        self._new_epoch()
        self.emitter.emit(
            Compaction(messages_before=before, tokens_before=tokens_before, summary=summary)
        )
        self._turns_since_compaction = 0
        return True

    def _kept(self) -> str:
        """What survives a compaction besides the summary: the todo list, as the model
        last wrote it (the panel keeps showing it, so the model must not forget it)."""
        return todo_reminder(self.todos.items) if self.todos is not None else ""

    async def undo(self) -> RestoreReport | None:
        """`/undo`: files and conversation back to before the last task that changed files.
        None when nothing this session changed files."""
        undone = await self.tools.undo_last_task()
        if undone is None:
            return None
        report, history_length = undone
        self.conversation.truncate(history_length)
        if self.todos is not None:
            self.todos.back_to(history_length)
        self._new_epoch()
        return report

    def _new_epoch(self) -> None:
        snapshot = self.context.new_epoch()
        self.emitter.emit(snapshot_event(snapshot, self.client.token_count_method))

    # -- one task ------------------------------------------------------------------

    async def run_task(self, task: str, shown: str | None = None) -> TaskOutcome:
        """Run `task`; `shown`: what the user's message shows instead (a custom command
        as typed, `/NAME args`, while the conversation keeps its expansion). A lone
        surrogate in either (a prompt over JSON-RPC, bytes in argv) is U+FFFD from here
        on (agent/core/valid_unicode.py)."""
        task = valid_text(task)
        shown = None if shown is None else valid_text(shown)
        self._interrupted.clear()
        self.tools.start_task()
        start_length = len(self.conversation)
        if self.todos is not None:
            self.todos.mark_task_start(start_length)
        mode = self.approval_mode
        self.emitter.emit(UserMessage(text=task if shown is None else shown))
        # In plan mode the model's copy carries the plan-mode instruction (plan_mode.py).
        content = task_for_model(task, mode)
        if self.hooks is not None:  # user_prompt hooks add context, or refuse the prompt
            verdict = await self.hooks.user_prompt(task, content)
            if verdict.blocked is not None:
                return TaskOutcome(verdict.blocked, "blocked")
            content = verdict.content
        self.conversation.commit([{"role": "user", "content": content}])
        turn = 0
        while True:
            if self._interrupted.is_set():
                return TaskOutcome("Interrupted.", "interrupted")
            if turn >= self.settings.max_turns:
                message = f"Stopped after {turn} turns (--max-turns) before the task was done."
                self.emitter.emit(ErrorEvent(message=message, kind="max_turns", fatal=True))
                return TaskOutcome(message, "max_turns")
            turn += 1
            outcome = await self._turn(turn, start_length)
            if outcome is not None:
                note = await self._stop_hooks(outcome)
                if note is None:
                    return self._as_plan(outcome, mode)
                self.conversation.commit([{"role": "user", "content": note}])

    async def _stop_hooks(self, outcome: TaskOutcome) -> str | None:
        """A stop hook's note when it sends a finished task back to work (hooks/dispatch.py)."""
        if self.hooks is None or outcome.reason != "done":
            return None
        return await self.hooks.stop(outcome.final_message)

    def _as_plan(self, outcome: TaskOutcome, started_in: ApprovalMode) -> TaskOutcome:
        """A task's outcome, marked as a proposed plan when it is one (plan_mode.py)."""
        reason, answer = outcome.reason, outcome.final_message
        if not proposes_plan(started_in, self.approval_mode, reason, answer):
            return outcome
        self.emitter.emit(PlanProposed(text=answer))
        return replace(outcome, plan=True)

    async def _prepare_context(self) -> None:
        await self.context.settle_tools()  # MCP servers still starting: a bounded wait
        messages = self.conversation.messages
        if self.context.over_compaction_threshold(messages) and self._turns_since_compaction > 0:
            await self.compact()  # at most once between two turns: never in a loop
        elif self.context.needs_new_epoch():
            self._new_epoch()

    async def _turn(self, turn: int, start_length: int) -> TaskOutcome | None:
        """One model request and its tool calls; an outcome when the task ends here."""
        await self._prepare_context()
        self.emitter.emit(TurnStarted(turn=turn))
        request = self.context.request(
            self.conversation.messages,
            max_tokens=self.settings.max_tokens,
            temperature=self.settings.temperature,
        )
        try:
            answer = await self._generate(request)
        except ContextOverflowError as err:
            if self._turns_since_compaction == 0:
                return self._fail(turn, err)  # compacting again would only loop
            self.emitter.emit(ErrorEvent(message=f"{err}; compacting", kind=err.kind))
            self.emitter.emit(TurnCompleted(turn=turn, finish_reason="context_overflow"))
            if not await self.compact():
                return TaskOutcome(str(err), "failed", err.kind)
            return None
        except ClientError as err:
            return self._fail(turn, err)
        self._turns_since_compaction += 1
        text = "".join(answer.text)
        self._report_usage(answer.completion)
        if answer.interrupted:
            if text:
                marked = text + "\n[interrupted by the user]"
                self.conversation.commit([{"role": "assistant", "content": marked}])
            self.emitter.emit(TurnCompleted(turn=turn, finish_reason="interrupted"))
            return TaskOutcome("Interrupted.", "interrupted")
        if not answer.calls:
            return self._answer_without_calls(turn, text, answer)
        return await self._run_calls(turn, text, answer, start_length)

    def _fail(self, turn: int, err: ClientError) -> TaskOutcome:
        self.emitter.emit(ErrorEvent(message=str(err), kind=err.kind, fatal=True))
        self.emitter.emit(TurnCompleted(turn=turn, finish_reason="error"))
        return TaskOutcome(str(err), "failed", err.kind)

    def _answer_without_calls(self, turn: int, text: str, answer: _Answer) -> TaskOutcome | None:
        assistant: Message = {"role": "assistant", "content": text}
        if answer.problems:
            # Markup that looked like a call but was not one: tell the model, go on.
            problems = "; ".join(answer.problems)
            self.emitter.emit(ErrorEvent(message=problems, kind="tool_call"))
            note = prompts.load("malformed_tool_call", problems=problems)
            self.conversation.commit([assistant, {"role": "user", "content": note}])
            self.emitter.emit(TurnCompleted(turn=turn, finish_reason="tool_call_error"))
            return None
        self.conversation.commit([assistant])
        reason = answer.completion.finish_reason if answer.completion else "stop"
        self.emitter.emit(TurnCompleted(turn=turn, finish_reason=reason))
        return TaskOutcome(text, "done")

    async def _run_calls(
        self, turn: int, text: str, answer: _Answer, start_length: int
    ) -> TaskOutcome | None:
        assistant: Message = {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": history_arguments(call.arguments_json),
                    },
                }
                for call in answer.calls
            ],
        }
        results: list[Message] = []
        stop_why: str | None = None
        needs_approval: str | None = None
        for group in self._call_groups(answer.calls):
            for chunk in group:
                self.emitter.emit(
                    ToolCallEvent(id=chunk.id, name=chunk.name, arguments=chunk.arguments_json)
                )
            if stop_why is None and self._interrupted.is_set():
                stop_why = "the user interrupted the task"
            if stop_why is not None:
                results.extend(self.tools.skip(chunk, stop_why).message for chunk in group)
                continue
            outcomes = await asyncio.gather(
                *(self.tools.run(chunk, history_length=start_length) for chunk in group)
            )
            for outcome in outcomes:
                results.append(outcome.message)
                if outcome.needs_unavailable_approval:
                    needs_approval = outcome.needs_unavailable_approval
                    stop_why = "the task stopped because an earlier call needed approval"
        self.conversation.commit([assistant, *results])
        self.emitter.emit(TurnCompleted(turn=turn, finish_reason="tool_calls"))
        if needs_approval is not None:
            message = f"Stopped: {needs_approval}, and nobody could approve it."
            self.emitter.emit(ErrorEvent(message=message, kind="approval", fatal=True))
            return TaskOutcome(message, "approval")
        if self._interrupted.is_set():
            return TaskOutcome("Interrupted.", "interrupted")
        return None

    def _call_groups(self, calls: list[ToolCall]) -> list[list[ToolCall]]:
        """The calls in order, neighbours that may run at the same time grouped
        (read-only subagents: one engine batch); every other call alone."""
        groups: list[list[ToolCall]] = []
        for chunk in calls:
            together = self.tools.runs_concurrently(chunk)
            if together and groups and self.tools.runs_concurrently(groups[-1][-1]):
                groups[-1].append(chunk)
            else:
                groups.append([chunk])
        return groups

    def _report_usage(self, completion: Completion | None) -> None:
        if completion is None or completion.usage is None:
            return
        usage = completion.usage
        self.emitter.emit(
            Usage(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                resident_tokens=self.context.resident_tokens,
                context_window=self.context.window,
            )
        )

    # -- generation ------------------------------------------------------------------

    def _unique_id(self, call: ToolCall) -> ToolCall:
        """Tool results are matched to calls by id, so a missing or reused id gets a new one."""
        if not call.id or call.id in self._call_ids:
            call = replace(call, id=f"call_{secrets.token_hex(8)}")
        self._call_ids.add(call.id)
        return call

    async def _generate(self, request) -> _Answer:
        """Stream one answer, emitting text as it comes; stops early on interrupt."""
        answer = _Answer()

        async def consume() -> None:
            async for item in valid_stream(self.client.stream(request)):
                # The mapping from stream items to events (agent/core/clients/base.py).
                if isinstance(item, ContentDelta):
                    answer.text.append(item.text)
                    self.emitter.emit(TextDelta(text=item.text))
                elif isinstance(item, ReasoningDelta):
                    self.emitter.emit(ReasoningDeltaEvent(text=item.text))
                elif isinstance(item, ToolCall):
                    answer.calls.append(self._unique_id(item))
                elif isinstance(item, ToolCallError):
                    answer.problems.append(item.message)
                elif isinstance(item, Completion):
                    answer.completion = item

        work = asyncio.create_task(consume())
        stop = asyncio.create_task(self._interrupted.wait())
        try:
            done, _ = await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the task itself is being torn down
            work.cancel()
            raise
        finally:
            stop.cancel()
        if work in done:
            work.result()  # raises the client's error, if any
            return answer
        work.cancel()  # closes the stream: the server or engine aborts the request
        with contextlib.suppress(asyncio.CancelledError, ClientError):
            await work
        answer.interrupted = True
        answer.calls.clear()  # a call cut off mid-stream is not a call
        return answer
