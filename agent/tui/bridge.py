"""The TUI's hold on the agent: a runtime on its own thread, reached by calls and messages.

Calls from the TUI run the agent's coroutines on the agent's thread and are
awaited from Textual workers, so neither side ever waits on the other's
loop. The agent's events and approval questions come back as Textual
messages. Nothing here decides anything the agent decides: it is the same
runtime API the headless runner and the REPL use.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from textual.message import Message

from agent.agent_thread import AgentThread
from agent.core.approval_preview import preview
from agent.core.clients import LLMClient
from agent.core.commands import (
    SessionApprovals,
    WorkspaceDiff,
    list_sessions,
    mcp_report,
    reopen_runtime,
    set_approval_mode,
    workspace_diff,
)
from agent.core.context_report import ContextReport, context_report
from agent.core.custom_commands import CustomCommands, resolve_task
from agent.core.engine_facts import engine_facts, reachable
from agent.core.events import Event, SessionCompleted
from agent.core.loop import TaskOutcome
from agent.core.plan_mode import proceed
from agent.core.runtime import Runtime, RuntimeOptions, open_runtime
from agent.core.session import SessionMeta, SessionStore
from agent.core.settings_report import session_settings
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest
from agent.tui.messages import AgentEvent, ApprovalNeeded, EngineInfo, History
from tools import ApprovalMode, RestoreReport

T = TypeVar("T")
INTERRUPTED_ANSWER = "The user interrupted the task."


class AgentBridge:
    def __init__(
        self,
        post: Callable[[Message], Any],
        options: RuntimeOptions,
        client: LLMClient | None = None,
    ) -> None:
        self.post = post
        self.options = options
        self._client = client
        self.thread: AgentThread | None = None
        self.runtime: Runtime | None = None
        self.approvals = SessionApprovals()
        self._waiting: dict[str, concurrent.futures.Future[ApprovalAnswer]] = {}
        self.last_message = ""
        # Custom slash commands of the workspace (read afresh each time they are wanted).
        self.commands = CustomCommands(Path(options.workspace))

    # -- plumbing ----------------------------------------------------------------------

    @property
    def attached_url(self) -> str | None:
        return self.options.attach

    def _sink(self, event: Event) -> None:
        self.post(AgentEvent(event))

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.thread is None:
            coro.close()
            raise RuntimeError("the agent is not running")
        return await self.thread.run_async(coro)

    def _runtime(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("the agent is not running")
        return self.runtime

    # -- opening and closing -----------------------------------------------------------

    async def open(self) -> None:
        """Start the agent (load the model or reach the server, take the snapshot).
        Raises what `open_runtime` raises; the TUI says what to do."""
        if self.thread is None:
            self.thread = AgentThread()
        self.runtime = await self._call(self._open())
        await self._report_engine()

    async def _open(self) -> Runtime:
        options = self.options
        resume = options.resume
        if resume is None and options.continue_last:
            latest = SessionStore().latest(Path(os.path.realpath(options.workspace)))
            resume = latest.id if latest is not None else None
        if resume is not None:
            self._post_history(resume)
            options = replace(options, resume=resume, continue_last=False)
        client, self._client = self._client, None  # a given client serves the first open only
        return await open_runtime(options, [self._sink], self._approve, client, "")

    def _post_history(self, session_id: str) -> None:
        events = SessionStore().open(session_id).load_events()
        self.post(History(events))

    async def _report_engine(self) -> None:
        runtime = self._runtime()
        facts = await self._call(engine_facts(runtime.client, self.options.api_key))
        self.post(EngineInfo(facts))

    async def close(self) -> None:
        """End the session (journaled as completed) and stop the agent's thread."""
        self._deny_waiting("The user left.")
        runtime, thread = self.runtime, self.thread
        self.runtime = None
        self.thread = None
        if thread is None:
            return
        if runtime is not None:

            async def finish() -> None:
                runtime.emitter.emit(SessionCompleted(final_message=self.last_message, exit_code=0))
                await runtime.close()

            try:
                await asyncio.wait_for(thread.run_async(finish()), timeout=30)
            except Exception:  # leaving must not fail on a broken connection
                pass
        thread.stop()

    # -- approvals -----------------------------------------------------------------------

    async def _approve(self, request: ApprovalRequest) -> ApprovalAnswer:
        """The runtime's approval callback, on the agent's thread."""
        if self.approvals.allows(request):
            return ApprovalAnswer(True, "allowed for this session")
        answer: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
        self._waiting[request.call_id] = answer
        workspace = self._runtime().agent.workspace
        self.post(ApprovalNeeded(request, preview(request, workspace)))
        try:
            return await asyncio.wrap_future(answer)
        finally:
            self._waiting.pop(request.call_id, None)

    def answer(self, request: ApprovalRequest, answer: ApprovalAnswer, remember: bool) -> None:
        """The user's answer to a waiting call (from the TUI's thread)."""
        if remember and answer.approved:
            self.approvals.remember(request)
        waiting = self._waiting.get(request.call_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(answer)

    def _deny_waiting(self, why: str) -> None:
        for waiting in list(self._waiting.values()):
            if not waiting.done():
                waiting.set_result(ApprovalAnswer(False, why))

    # -- work ------------------------------------------------------------------------------

    async def run_task(self, text: str) -> TaskOutcome:
        """Run a message as a task; a custom command (`/NAME args`) runs its expansion."""
        task, shown = resolve_task(text, self.commands)
        if text.startswith("/") and shown is None:  # its file went away since it was sent
            raise ValueError(f"{text.split()[0]} is no longer a command; /help lists them")
        outcome = await self._call(self._runtime().agent.run_task(task, shown))
        self.last_message = outcome.final_message
        return outcome

    def interrupt(self) -> None:
        """Stop generation and any running tool; a waiting approval counts as denied."""
        self._deny_waiting(INTERRUPTED_ANSWER)
        if self.thread is not None and self.runtime is not None:
            self.thread.call(self.runtime.agent.interrupt)

    async def compact(self) -> bool:
        return await self._call(self._runtime().agent.compact())

    async def undo(self) -> RestoreReport | None:
        return await self._call(self._runtime().agent.undo())

    async def _reopen(self, resume: str | None = None, model: str | None = None) -> None:
        old = self._runtime()

        async def reopen() -> Runtime:
            if resume is not None and resume != old.session.id:
                self._post_history(resume)
            return await reopen_runtime(
                old,
                self.options,
                [self._sink],
                self._approve,
                self.last_message,
                resume=resume,
                model=model,
            )

        self.runtime = await self._call(reopen())
        self.approvals.clear()
        if model is not None:
            self.options = replace(self.options, model=model)
            await self._report_engine()

    async def clear(self) -> None:
        self.last_message = ""
        await self._reopen()

    async def resume(self, session_id: str) -> None:
        self.last_message = ""
        await self._reopen(resume=session_id)

    async def switch_model(self, model: str) -> None:
        await self._reopen(resume=self._runtime().session.id, model=model)

    # -- questions -----------------------------------------------------------------------

    def session_id(self) -> str:
        return self._runtime().session.id

    def approval_mode(self) -> ApprovalMode:
        return self._runtime().agent.approval_mode

    def set_approval(self, mode: ApprovalMode) -> ApprovalMode:
        return set_approval_mode(self._runtime().agent, mode)

    def proceed_with_plan(self, mode: ApprovalMode) -> str:
        """Carry out the proposed plan in `mode`: switches the mode and returns the
        follow-up task to send (agent/core/plan_mode.py)."""
        return proceed(self._runtime().agent, mode)

    async def context_report(self) -> ContextReport:
        agent = self._runtime().agent

        async def report() -> ContextReport:
            return context_report(agent.context, agent.conversation.messages)

        return await self._call(report())

    async def diff(self) -> WorkspaceDiff:
        agent = self._runtime().agent
        return await self._call(asyncio.to_thread(workspace_diff, agent))

    def mcp_report(self) -> list[str]:
        return mcp_report(self._runtime())

    async def settings_report(self) -> list[str]:
        return await self._call(session_settings(self._runtime(), self.options))

    async def sessions(self) -> list[SessionMeta]:
        agent = self._runtime().agent
        return list(await self._call(asyncio.to_thread(list_sessions, agent)))

    async def engine_reachable(self) -> bool:
        if self.options.attach is None:
            return True
        return await reachable(self.options.attach, self.options.api_key)
