"""The TUI's slash commands: each calls the agent through the bridge and shows the result.

What the commands do lives in agent/core/commands.py (shared with the REPL);
this file only decides how each result looks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from textual.screen import Screen
from textual.widgets import Markdown

from agent.core.commands import APPROVAL_MODES, find_command, undo_summary
from agent.core.custom_commands import CustomCommand, Discovery, parse_invocation
from agent.tui.bridge import AgentBridge
from agent.tui.help import help_markdown
from agent.tui.screens.context import ContextScreen
from agent.tui.screens.sessions import SessionsScreen
from agent.tui.widgets.conversation import ConversationView
from agent.tui.widgets.diff_block import DiffBlock
from agent.tui.widgets.prompt_input import PromptInput
from agent.tui.widgets.status_bar import StatusBar
from tools import ApprovalMode


class CommandHost(Protocol):
    """What the commands need of the app (ResidentApp), named here so this file needs no app."""

    bridge: AgentBridge
    ready: bool
    busy: bool
    queued: list[str]

    @property
    def conversation(self) -> ConversationView: ...

    @property
    def prompt(self) -> PromptInput: ...

    @property
    def status(self) -> StatusBar: ...

    async def run_exclusive(self, words: str, work: Awaitable[Any]) -> bool: ...

    def send(self, text: str) -> None: ...

    def notify(self, message: str, *, timeout: float | None = None) -> None: ...

    def submit(self, text: str) -> None: ...

    async def refresh_files(self) -> None: ...

    async def action_quit(self) -> None: ...

    def push_screen(self, screen: Screen) -> Any: ...

    async def push_screen_wait(self, screen: Screen) -> Any: ...


class SlashCommands:
    def __init__(self, app: CommandHost) -> None:
        self.app = app

    @property
    def view(self):
        return self.app.conversation

    async def run(self, line: str) -> None:
        name, _, argument = line.strip().partition(" ")
        command = find_command(name)
        if command is None:
            await self._custom(line)
            return
        if command.name not in ("/help", "/quit") and not self.app.ready:
            await self.view.note("The agent is still starting; try again in a moment.", "warning")
            return
        handler = getattr(self, "do_" + command.name[1:])
        await handler(argument.strip())

    async def do_help(self, _: str) -> None:
        discovery = await self._discover()
        await self.view.add_widget(Markdown(help_markdown(discovery.commands), classes="help"))

    # -- custom commands (agent/core/custom_commands.py) ----------------------------------

    async def _tell(self, problems: Sequence[str]) -> None:
        if problems:
            await self.view.note("\n".join(problems), "warning")

    async def _discover(self) -> Discovery:
        """The custom commands as they are now; problems not told yet shown as a note."""
        commands = self.app.bridge.commands
        discovery = commands.discover()
        await self._tell(commands.new_problems(discovery))
        return discovery

    async def report_command_problems(self) -> None:
        """At start: what is wrong with the command files, before anyone types `/`."""
        await self._discover()

    def completion_commands(self) -> Sequence[CustomCommand]:
        """For the input box's completion (called as the user types, so it cannot wait:
        a problem found now is noted by a worker)."""
        commands = self.app.bridge.commands
        discovery = commands.discover()
        problems = commands.new_problems(discovery)
        if problems:
            self.view.run_worker(self._tell(problems), exit_on_error=False)
        return discovery.commands

    async def _custom(self, line: str) -> None:
        """`/NAME args` for a custom command: sent as a task (the bridge expands it),
        queued like any message while the agent is busy."""
        parsed = parse_invocation(line)
        if parsed is None or (await self._discover()).find(parsed[0]) is None:
            name = f"/{parsed[0]}" if parsed else line.strip()
            await self.view.note(f"Unknown command {name}; /help lists them.", "warning")
            return
        if self.app.busy or not self.app.ready:
            self.app.queued.append(line)
            self.app.notify("Queued; sent when the agent is free.", timeout=3)
        else:
            self.app.send(line)

    async def do_quit(self, _: str) -> None:
        await self.app.action_quit()

    async def do_model(self, name: str) -> None:
        bridge = self.app.bridge
        if name:
            words = f"Switching to {name}" + ("" if bridge.attached_url else " (loading it)")
            if await self.app.run_exclusive(words + "…", bridge.switch_model(name)):
                await self.view.note(f"Now using {name}.", "good")
            return
        status = self.app.status
        lines = [
            f"Model: {status.model or '?'}",
            f"Engine: {status.engine or '?'}",
            f"KV cache: {status.kv_dtype or 'not published by the server'}",
            f"Context window: {status.window:,} tokens",
            "Switch with /model NAME (a name from `resident models list`, a model folder, "
            "or a model the server lists).",
        ]
        await self.view.note("\n".join(lines))

    async def do_context(self, _: str) -> None:
        report = await self.app.bridge.context_report()
        await self.app.push_screen(ContextScreen(report))

    async def do_compact(self, _: str) -> None:
        done = False

        async def compact() -> None:
            nonlocal done
            done = await self.app.bridge.compact()

        if await self.app.run_exclusive("Compacting the conversation…", compact()):
            if not done:
                await self.view.note("Nothing was compacted.", "warning")

    async def do_undo(self, _: str) -> None:
        reports = []

        async def undo() -> None:
            reports.append(await self.app.bridge.undo())

        if not await self.app.run_exclusive("Undoing…", undo()):
            return
        report = reports[0]
        first, *rest = undo_summary(report)
        if report is not None:
            taken_back = await self.view.undo_task(report.checkpoint.id)
            if taken_back:
                self.app.prompt.put(taken_back)
        await self.view.note("\n".join([first, *rest]), "good" if report else "warning")
        await self.app.refresh_files()

    async def do_diff(self, _: str) -> None:
        result = await self.app.bridge.diff()
        block = DiffBlock.from_unified(result.text) if result.ok else None
        if block is None:
            await self.view.note(
                result.text.strip() or "(no differences)", "" if result.ok else "warning"
            )
            return
        await self.view.note(f"Uncommitted changes: {len(block.files)} files.")
        await self.view.add_widget(block)

    async def do_clear(self, _: str) -> None:
        async def clear() -> None:
            await self.view.clear()
            await self.app.bridge.clear()

        await self.app.run_exclusive("Starting a new session…", clear())

    async def do_sessions(self, _: str) -> None:
        sessions = await self.app.bridge.sessions()
        if not sessions:
            await self.view.note("No sessions in this repository yet.")
            return
        current = self.app.bridge.session_id()
        chosen = await self.app.push_screen_wait(SessionsScreen(sessions, current))
        if chosen and chosen != current:
            await self.app.run_exclusive("Resuming the session…", self.app.bridge.resume(chosen))

    async def do_mcp(self, _: str) -> None:
        await self.view.note("\n".join(self.app.bridge.mcp_report()))

    async def do_approval(self, mode: str) -> None:
        bridge = self.app.bridge
        if not mode:
            await self.view.note(
                f"Approval mode: {bridge.approval_mode().value} "
                f"(modes: {', '.join(APPROVAL_MODES)}; /approval MODE changes it)."
            )
            return
        try:  # the typed word becomes a mode here, at the edge; the bridge takes the mode
            chosen = bridge.set_approval(ApprovalMode.parse(mode))
        except ValueError as err:
            await self.view.note(str(err), "warning")
            return
        self.app.status.set_approval(chosen.value)
        await self.view.note(f"Approval mode is now {chosen.value}.", "good")

    async def do_settings(self, _: str) -> None:
        await self.view.note("\n".join(await self.app.bridge.settings_report()))

    async def do_plan(self, task: str) -> None:
        """Plan mode (agent/core/plan_mode.py); with a task, plan it right away."""
        chosen = self.app.bridge.set_approval(ApprovalMode.PLAN)
        self.app.status.set_approval(chosen.value)
        await self.view.note(
            "Plan mode: the agent explores read-only and proposes a plan; nothing changes "
            "until you approve it." + ("" if task else " Type the task."),
            "good",
        )
        if task:
            self.app.submit(task)
