"""The Resident TUI: the agent's events drawn as a conversation, the user's input sent back.

It holds no agent logic (DESIGN.md §1): the agent runs on its own thread
behind `AgentBridge`, its events arrive as messages and are drawn; the user's
messages, approvals, interrupts and commands go back through the bridge.
Work the app waits for (a task, a command) runs in Textual workers, so the
screen keeps drawing and taking keys whatever the agent is doing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.filter import LineFilter
from textual.widgets import Footer

from agent.core.clients import ClientError, LLMClient, TransientError
from agent.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    ContextSnapshot,
    ErrorEvent,
    SessionStarted,
    ToolCallEvent,
    ToolResultEvent,
    TurnStarted,
)
from agent.core.runtime import RuntimeOptions, UnknownToolError
from agent.core.session import SessionNotFound
from agent.exit_codes import EXIT_FAILED, EXIT_USAGE, error_exit_code
from agent.tui.bridge import AgentBridge
from agent.tui.connection import DEFAULT_DELAYS_S, ConnectionWatcher
from agent.tui.control_filter import ControlCharacterFilter
from agent.tui.messages import AgentEvent, ApprovalNeeded, EngineInfo, History
from agent.tui.prompt_history import PromptHistory
from agent.tui.slash import SlashCommands
from agent.tui.widgets.approval import ApprovalPrompt
from agent.tui.widgets.banner import ConnectionBanner
from agent.tui.widgets.completion_menu import CompletionMenu
from agent.tui.widgets.conversation import ConversationView, EarlierMessages
from agent.tui.widgets.notes import ErrorNote
from agent.tui.widgets.plan_prompt import PlanPrompt
from agent.tui.widgets.prompt_input import PromptInput
from agent.tui.widgets.reasoning import ReasoningBlock
from agent.tui.widgets.status_bar import StatusBar
from agent.tui.widgets.todo_panel import TodoPanel
from agent.tui.widgets.tool_block import ToolBlock
from agent.tui.widgets.work_indicator import WorkIndicator
from tools.workspace.walk import visible_files

WORKING = "Working · ctrl+c interrupts"
CONTROL_FILTER = ControlCharacterFilter()  # holds no state: one for every app


class ResidentApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "Resident"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+c", "interrupt", "Interrupt/quit", priority=True),
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
        Binding("f1", "help", "Help"),
        Binding("ctrl+o", "toggle_tools", "Fold tools"),
        Binding("ctrl+t", "toggle_thinking", "Fold thinking"),
        Binding("ctrl+up", "show_earlier", "Earlier", show=False),
        Binding("escape", "focus_input", "Input", show=False),
    ]

    def __init__(
        self,
        options: RuntimeOptions,
        *,
        client: LLMClient | None = None,
        bridge: AgentBridge | None = None,
        clock: Callable[[], float] = time.monotonic,
        history_path: Path | None = None,
        retry_delays: Sequence[float] = DEFAULT_DELAYS_S,
    ) -> None:
        super().__init__()
        self.options = options
        self.bridge = bridge or AgentBridge(self.post_message, options, client)
        self.clock = clock
        self.history = PromptHistory(history_path)
        self.retry_delays = retry_delays
        self.slash = SlashCommands(self)
        self.busy = False
        self.ready = False
        self.queued: list[str] = []
        self.exit_code = 0
        self._quit_armed = False
        self._leaving = False

    # -- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        menu = CompletionMenu()
        yield ConnectionBanner()
        yield ConversationView()
        yield TodoPanel()
        yield WorkIndicator()
        yield menu
        yield PromptInput(menu, self.history, self.slash.completion_commands)
        yield StatusBar(self.clock)
        yield Footer()

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's filters, after the one that shows control characters as text."""
        return [CONTROL_FILTER, *super().get_line_filters()]

    @property
    def conversation(self) -> ConversationView:
        return self.query_one(ConversationView)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def indicator(self) -> WorkIndicator:
        return self.query_one(WorkIndicator)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    def on_mount(self) -> None:
        where = self.options.attach or "the local engine"
        self.connection = ConnectionWatcher(
            self.query_one(ConnectionBanner),
            self.bridge.engine_reachable,
            where,
            self.retry_delays,
        )
        self.prompt.focus()
        self.run_worker(self._start(), name="start", exit_on_error=False)

    # -- starting ------------------------------------------------------------------------

    async def _start(self) -> None:
        attached = self.options.attach
        self.indicator.start(
            f"Connecting to {attached}…" if attached else "Loading the model into the local engine…"
        )
        while True:
            try:
                await self.bridge.open()
                break
            except TransientError as err:
                if not attached:
                    return await self._failed_start(err, err.kind, error_exit_code(err.kind))
                await self.connection.wait_until_back()
            except ClientError as err:
                return await self._failed_start(err, err.kind, error_exit_code(err.kind))
            except (SessionNotFound, UnknownToolError) as err:
                return await self._failed_start(err, "usage", EXIT_USAGE)
            except Exception as err:  # e.g. the engine could not load the model
                return await self._failed_start(err, "engine", EXIT_FAILED)
        self.ready = True
        self.indicator.stop()
        self.status.set_approval(self.bridge.approval_mode().value)
        await self.refresh_files()
        await self.slash.report_command_problems()
        if self.queued:
            self.send(self.queued.pop(0))

    async def _failed_start(self, err: Exception, kind: str, code: int) -> None:
        self.indicator.stop()
        self.exit_code = code
        await self.conversation.add_widget(ErrorNote(str(err), kind, fatal=True))
        await self.conversation.note("The agent could not start; ctrl+q quits.", "warning")

    async def refresh_files(self) -> None:
        """The repository's files, for @path completion (listed off the event loop)."""
        runtime = self.bridge.runtime
        if runtime is None:
            return
        root = runtime.agent.workspace
        try:
            files = await asyncio.to_thread(lambda: list(visible_files(root, root)))
        except OSError:
            return
        self.prompt.files = files

    # -- the agent's side ----------------------------------------------------------------

    async def on_agent_event(self, message: AgentEvent) -> None:
        event = message.event
        self.status.on_agent_event(event)
        self.query_one(TodoPanel).handle(event)
        await self.conversation.handle(event)
        if not self.ready and isinstance(event, SessionStarted):
            self.indicator.start("Taking the repository snapshot…")
        elif isinstance(event, ContextSnapshot) and not self.busy:
            self.indicator.stop()
        elif self.busy and isinstance(event, TurnStarted | ToolResultEvent):
            self.indicator.start(WORKING)
        elif self.busy and isinstance(event, ToolCallEvent):
            self.indicator.start(f"Running {event.name} · ctrl+c interrupts")
        elif isinstance(event, ApprovalRequested):
            self.indicator.start("Waiting for your approval: y once, a session, n deny", spin=False)
        elif isinstance(event, ApprovalResolved):
            if self.busy:
                self.indicator.start(WORKING)
            else:
                self.indicator.stop()
        elif isinstance(event, ErrorEvent) and event.kind == "transient" and self.options.attach:
            self.run_worker(self.connection.wait_until_back(), exit_on_error=False)

    async def on_history(self, message: History) -> None:
        self.query_one(TodoPanel).replay(message.events)
        await self.conversation.replay(message.events)

    def on_engine_info(self, message: EngineInfo) -> None:
        self.status.set_engine(message.facts)

    async def on_approval_needed(self, message: ApprovalNeeded) -> None:
        prompt = await self.conversation.ask(message.request, message.preview)
        prompt.focus()

    @on(ApprovalPrompt.Answered)
    def _approval_answered(self, message: ApprovalPrompt.Answered) -> None:
        self.bridge.answer(message.request, message.answer, message.remember)
        self.indicator.start(WORKING)
        self.prompt.focus()

    async def offer_plan(self) -> PlanPrompt:
        """After a plan (plan mode): carry it out in which mode, or keep planning."""
        prompt = PlanPrompt()
        await self.conversation.add_widget(prompt)
        self.conversation.anchor()
        prompt.focus()
        return prompt

    @on(PlanPrompt.Chosen)
    async def _plan_chosen(self, message: PlanPrompt.Chosen) -> None:
        await self.query(PlanPrompt).remove()
        self.prompt.focus()
        if not message.choice.proceeds:
            await self.conversation.note("Still in plan mode: type what to change in the plan.")
            return
        follow_up = self.bridge.proceed_with_plan(message.choice.mode)
        self.status.set_approval(message.choice.mode.value)
        await self.conversation.note(
            f"Approval mode is now {message.choice.mode.value}; carrying out the plan.", "good"
        )
        self.submit(follow_up)

    # -- the user's side -----------------------------------------------------------------

    @on(PromptInput.Submitted)
    def _submitted(self, message: PromptInput.Submitted) -> None:
        self._quit_armed = False
        text = message.text
        if text.startswith("/"):
            self.run_worker(self.slash.run(text), exit_on_error=False)
        else:
            self.submit(text)

    def submit(self, text: str) -> None:
        """Send a message now, or queue it while the agent is busy or starting."""
        if self.busy or not self.ready:
            self.queued.append(text)
            self.notify("Queued; sent when the agent is free.", timeout=3)
        else:
            self.send(text)

    def send(self, text: str) -> None:
        self.query(PlanPrompt).remove()  # a message instead of a choice: keep planning
        self.busy = True
        self.conversation.anchor()
        self.run_worker(self._run_task(text), group="task", exit_on_error=False)

    async def _run_task(self, text: str) -> None:
        self.indicator.start(WORKING)
        try:
            outcome = await self.bridge.run_task(text)
            if outcome.reason == "interrupted":
                await self.conversation.note_interrupted()
            elif outcome.plan and not self.queued:
                await self.offer_plan()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the agent failed; the session goes on
            await self.conversation.add_widget(ErrorNote(str(err), "internal"))
        finally:
            self.busy = False
            self.indicator.stop()
        await self.refresh_files()
        if self.queued and not self._leaving:
            self.send(self.queued.pop(0))

    async def run_exclusive(self, words: str, work) -> bool:
        """Run agent work that needs the agent idle (compact, undo, switching sessions)."""
        if self.busy or not self.ready:
            work.close()
            await self.conversation.note(
                "The agent is busy; wait for it to finish or press ctrl+c to interrupt.",
                "warning",
            )
            return False
        self.busy = True
        self.indicator.start(words)
        try:
            await work
            return True
        except ClientError as err:
            await self.conversation.add_widget(ErrorNote(str(err), err.kind))
        except (SessionNotFound, ValueError, OSError) as err:
            await self.conversation.add_widget(ErrorNote(str(err), "usage"))
        finally:
            self.busy = False
            self.indicator.stop()
        return False

    # -- actions -------------------------------------------------------------------------

    async def action_interrupt(self) -> None:
        if self._quit_armed:
            await self.action_quit()
            return
        self._quit_armed = True
        if self.busy:
            self.bridge.interrupt()
            self.indicator.start("Interrupting · ctrl+c again quits")
        else:
            self.notify("Press ctrl+c again to quit.", timeout=3)

    async def action_quit(self) -> None:
        if self._leaving:
            return
        self._leaving = True
        self.indicator.start("Closing the session…")
        self.bridge.interrupt()
        self.workers.cancel_group(self, "task")
        await self.bridge.close()
        self.exit(self.exit_code)

    async def action_help(self) -> None:
        await self.slash.run("/help")

    def action_toggle_tools(self) -> None:
        blocks = list(self.query(ToolBlock))
        fold = any(not block.collapsed for block in blocks)
        for block in blocks:
            block.collapsed = fold

    def action_toggle_thinking(self) -> None:
        blocks = list(self.query(ReasoningBlock))
        fold = any(not block.collapsed for block in blocks)
        for block in blocks:
            block.collapsed = fold

    async def action_show_earlier(self) -> None:
        await self.conversation.show_earlier()

    @on(EarlierMessages.Show)
    async def _show_earlier(self) -> None:
        await self.conversation.show_earlier()

    def action_focus_input(self) -> None:
        self.prompt.menu.close()
        self.prompt.focus()


def run_tui(options: RuntimeOptions, client: LLMClient | None = None) -> int:
    """The interactive agent in the terminal; returns the exit code (0 when the user leaves)."""
    app = ResidentApp(options, client=client)
    code = app.run()
    return code if isinstance(code, int) else app.exit_code
