"""One ACP session: a runtime, its stream of updates to the client, its turn and its cancel.

The runtime's event sink is synchronous and runs on the agent's loop (the
connection's loop too), so updates go through a queue that one task sends
in order; before a permission request and before a prompt's answer the
queue is drained, so the client always knows a tool call before it is asked
about it, and has every update of a turn before the turn's stop reason.

Cancelling does what Ctrl-C does in the TUI: the agent stops generating,
a running command is killed, calls not yet run are reported to the model as
not run, and a permission request still open is answered "denied" here
without waiting for the client. The prompt then ends with `cancelled`, and
the session takes the next prompt as usual.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from acp import RequestError, update_agent_message_text
from acp.interfaces import Client
from acp.schema import (
    AvailableCommand,
    PermissionOption,
    PromptResponse,
    RequestPermissionResponse,
    StopReason,
    ToolCallUpdate,
)

from agent.acp.commands import acp_builtin, available_commands, commands_update, run_builtin
from agent.acp.engines import Engines
from agent.acp.files import ClientFiles
from agent.acp.permissions import CANCELLED, PermissionBridge
from agent.acp.prompt import prompt_text
from agent.acp.tool_calls import preview_content
from agent.acp.updates import SessionUpdate, UpdateTranslator, replay_updates
from agent.core.approval_preview import preview
from agent.core.commands import SlashCommand, approval_mode, set_approval_mode
from agent.core.custom_commands import CustomCommands, Discovery
from agent.core.events import Event, SessionCompleted
from agent.core.loop import TaskOutcome
from agent.core.runtime import Runtime, RuntimeOptions, open_runtime
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest
from tools import ApprovalMode
from tools.sandbox.bubblewrap import SandboxUnavailable
from tools.workspace.paths import PathError, resolve_path

log = logging.getLogger(__name__)


class AcpSession:
    def __init__(self, client: Client, workspace: Path, files: ClientFiles) -> None:
        self.client = client
        self.workspace = workspace
        self.files = files
        self.translate = UpdateTranslator(workspace)
        self.permissions = PermissionBridge(self._ask_client)
        self.runtime: Runtime | None = None
        self.id = ""
        self.working = False  # a prompt turn is running
        self.last_message = ""
        self._cancelled = asyncio.Event()
        self._updates: asyncio.Queue[SessionUpdate] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self.commands = CustomCommands(workspace)
        self._offered: list[AvailableCommand] | None = None  # the list the client has

    @classmethod
    async def open(
        cls,
        client: Client,
        options: RuntimeOptions,
        engines: Engines,
        files: ClientFiles,
        history: list[Event] | None = None,
    ) -> AcpSession:
        """A new session, or (with `options.resume`) an earlier one whose journaled
        `history` is replayed to the client before this returns."""
        session = cls(client, options.workspace, files)
        llm = await engines.client_for_session()
        session.runtime = await open_runtime(
            options,
            [session._sink],
            session._approve,
            llm,
            "",
            file_access=files if files.offered else None,
        )
        session.id = files.session_id = session.runtime.session.id
        if isinstance(session.runtime.sandbox, SandboxUnavailable):
            log.warning(
                "no sandbox (%s); every shell command needs approval",
                session.runtime.sandbox.reason,
            )
        session._pump = asyncio.create_task(session._send_updates(), name=f"acp-{session.id}")
        for update in replay_updates(history or [], session.workspace):
            session._updates.put_nowait(update)
        await session.flush()
        return session

    # -- updates -------------------------------------------------------------------

    def _sink(self, event: Event) -> None:
        for update in self.translate(event):
            self._updates.put_nowait(update)

    async def _send_updates(self) -> None:
        while True:
            update = await self._updates.get()
            try:
                await self.client.session_update(session_id=self.id, update=update)
            except Exception as err:  # a gone client must not stop the agent's work
                log.debug("could not send a session update: %s", err)
            finally:
                self._updates.task_done()

    # -- commands ------------------------------------------------------------------

    def _discover(self) -> Discovery:
        """The custom commands as they are now; what is wrong with their files is
        logged, once per session."""
        discovery = self.commands.discover()
        for problem in self.commands.new_problems(discovery):
            log.warning("custom command: %s", problem)
        return discovery

    def _offer_commands(self, always: bool = False) -> None:
        """Send the commands the editor offers, when they changed (or `always`)."""
        commands = available_commands(self._discover().commands)
        if always or commands != self._offered:
            self._offered = commands
            self._updates.put_nowait(commands_update(commands))

    def offer_commands_after_reply(self) -> None:
        """Send the command list once the session/new or session/load reply is out: the
        client knows the session only from that reply. The SDK queues the reply, without
        yielding, as soon as the handler returns, so a callback scheduled now runs after."""
        asyncio.get_running_loop().call_soon(self._offer_commands, True)

    async def flush(self) -> None:
        """Wait until every update so far has been sent."""
        if self._pump is not None and not self._pump.done():
            await self._updates.join()

    # -- approvals -----------------------------------------------------------------

    async def _ask_client(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption]
    ) -> RequestPermissionResponse:
        return await self.client.request_permission(
            session_id=self.id, tool_call=tool_call, options=options
        )

    async def _preview_from_editor(self, request: ApprovalRequest) -> None:
        """The diff of a file change from the editor's text rather than the disk's, when
        the editor serves reads: unsaved changes are what the edit will apply to."""
        raw = request.arguments.get("path")
        if request.tool not in ("edit", "write") or not isinstance(raw, str):
            return
        if self.permissions.remembered(request) is not None:
            return  # nobody will look at it
        try:
            path = resolve_path(raw, [self.workspace]).real
        except PathError:
            return
        if not path.is_file():
            return
        text = await self.files.read_text_async(path)
        if text is None:
            return
        content = preview_content(preview(request, self.workspace, text), self.workspace)
        for update in self.translate.revise(request.call_id, content):
            self._updates.put_nowait(update)

    async def _approve(self, request: ApprovalRequest) -> ApprovalAnswer:
        """The runtime's approval callback: the client is asked, unless the turn is
        cancelled first."""
        await self._preview_from_editor(request)
        await self.flush()
        if self._cancelled.is_set():
            return ApprovalAnswer(False, CANCELLED)
        content = self.translate.call_content(request.call_id)
        asking = asyncio.ensure_future(self.permissions.approve(request, content))
        cancelled = asyncio.ensure_future(self._cancelled.wait())
        try:
            done, _ = await asyncio.wait({asking, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if asking not in done:
            asking.cancel()
            return ApprovalAnswer(False, CANCELLED)
        try:
            return asking.result()
        except Exception as err:  # the client failed to answer: nobody approved
            log.warning("permission request failed: %s", err)
            return ApprovalAnswer(False, f"The permission request failed ({err}).")

    # -- turns -----------------------------------------------------------------------

    def _agent(self):
        if self.runtime is None:
            raise RequestError.internal_error({"details": "the session is not open"})
        return self.runtime.agent

    async def prompt(self, blocks: list[Any]) -> PromptResponse:
        agent = self._agent()
        if self.working:
            raise RequestError.invalid_request(
                {"details": "this session is already working on a prompt; cancel it first"}
            )
        text = prompt_text(blocks, self.workspace)
        builtin = acp_builtin(text)
        if builtin is not None:
            return await self._run_builtin(builtin)
        discovery = self._discover()
        invocation = self.commands.invocation(text, discovery)
        self.working = True
        self._cancelled.clear()
        assert self.runtime is not None
        self.runtime.session.set_title(text)
        try:
            if invocation is None:
                outcome = await agent.run_task(text)
            else:  # the journal shows `/NAME args`; the model gets the expansion
                outcome = await agent.run_task(invocation.prompt, invocation.typed)
        finally:
            self.working = False
        self._offer_commands()  # a command file added or changed during the turn
        await self.flush()
        self.last_message = outcome.final_message
        if self._cancelled.is_set():
            return PromptResponse(stop_reason="cancelled")
        return PromptResponse(stop_reason=self._stop_reason(outcome))

    async def _run_builtin(self, command: SlashCommand) -> PromptResponse:
        """A built-in command (agent/acp/commands.py): its answer as the agent's message."""
        assert self.runtime is not None
        self.working = True
        try:
            answer = await run_builtin(command, self.runtime)
        finally:
            self.working = False
        self._updates.put_nowait(update_agent_message_text(answer))
        self._offer_commands()
        await self.flush()
        return PromptResponse(stop_reason="end_turn")

    def _stop_reason(self, outcome: TaskOutcome) -> StopReason:
        if outcome.reason == "interrupted":
            return "cancelled"
        if outcome.reason == "max_turns":
            return "max_turn_requests"
        if outcome.reason == "blocked":  # a user_prompt hook refused the prompt
            return "refusal"
        if outcome.reason == "failed":
            # The model could not be reached or failed: the turn did not end, it broke.
            raise RequestError(-32603, outcome.final_message, {"kind": outcome.error_kind})
        finish = self.translate.last_finish_reason
        if finish == "length":
            return "max_tokens"
        if finish == "content_filter":
            return "refusal"
        return "end_turn"

    def cancel(self) -> None:
        if not self.working:
            return
        self._cancelled.set()
        self._agent().interrupt()

    # -- modes and closing -----------------------------------------------------------

    def approval(self) -> ApprovalMode:
        return approval_mode(self._agent())

    def set_approval(self, mode: ApprovalMode) -> None:
        set_approval_mode(self._agent(), mode)

    async def close(self) -> None:
        """End the session: an unfinished turn is interrupted, the journal completed."""
        runtime, self.runtime = self.runtime, None
        if runtime is not None:
            # Also when the prompt's task was cancelled already (the connection went
            # away): a command still running in a worker thread is killed here.
            runtime.agent.interrupt()
            runtime.emitter.emit(SessionCompleted(final_message=self.last_message, exit_code=0))
            await runtime.close()
        if self._pump is not None:
            self._pump.cancel()
