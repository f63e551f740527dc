"""What each hook event sends, and what its hooks' answers do to the session.

`Hooks` is the one object the runtime hands to the loop and the tool runner
(None when no hooks file exists, so a session without hooks pays nothing).
Hooks of an event run one after another, the user's first, in file order;
every run is a `hook` event.

    exit 0   go on. stdout, when it is a JSON object with "additional_context"
             (or, at user_prompt and session_start, plain text), is added for
             the model.
    exit 2   block: pre_tool (the call is not run; its result says why),
             user_prompt (the prompt is not sent; the user sees why), stop
             (the task goes on with the reason as a user note, at most
             MAX_STOP_CONTINUATIONS times a task), post_tool (stderr is added
             to the result the model sees). At session_start it only warns.
    else     a warning for the user (an `error` event of kind "hook"), and the
             work goes on: a timeout, another exit, a command that cannot start.

What a hook adds for the model goes at the end of the conversation, never into
the system prompt (which must stay byte-identical for the cached prefix): on
the user's message (user_prompt; session_start's waits for the first
prompt), on the tool's result (pre_tool, post_tool), or as a user note (stop).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.core.events import ErrorEvent, Event, HookRun
from agent.core.hooks.active import Notice
from agent.core.hooks.config import TOOL_EVENTS, Hook
from agent.core.hooks.runner import Confinement, HookResult, run_hook
from agent.core.hooks.scripts import ScriptGuard
from agent.core.valid_unicode import json_text
from tools import ApprovalMode, ToolResult
from tools.sandbox.grants import CommandSandbox, SandboxGrant, SandboxSettings

MAX_STOP_CONTINUATIONS = 3  # per task: a stop hook cannot keep a task going forever
CONTEXT_LIMIT = 8_000  # characters one hook may add for the model
PAYLOAD_TEXT_LIMIT = 16_000  # characters of a tool's output or a final message sent to hooks
CANNOT_BLOCK = frozenset({"session_start"})

Outcome = Literal["allowed", "blocked", "warning", "timeout"]


@dataclass(frozen=True)
class Ran:
    """One hook's run, judged."""

    hook: Hook
    outcome: Outcome
    context: str = ""  # exit 0: what it adds for the model
    reason: str = ""  # exit 2: its stderr
    problem: str = ""  # warning, timeout: what went wrong
    interrupted: bool = False  # stopped by the user's interrupt


@dataclass(frozen=True)
class PromptVerdict:
    content: str  # the user message the model gets: the prompt, then the hooks' context
    blocked: str | None = None  # why the prompt was not sent


@dataclass(frozen=True)
class ToolVerdict:
    blocked: str | None = None  # the tool result the model gets instead of a run
    notes: tuple[str, ...] = ()  # context for the result, when the call runs


def _capped(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n[... {len(text) - limit:,} characters cut]", True


def for_model(hook: Hook, text: str) -> str:
    """A hook's words as the model sees them: marked, so they are not taken for the user's."""
    name = hook.name.replace('"', "'").replace("\n", " ")
    return f'<hook event="{hook.event}" name="{name}">\n{text.strip()}\n</hook>'


def context_of(stdout: str, event: str) -> str:
    """What exit 0's stdout adds: a JSON object's "additional_context", or plain text
    where the event takes it (user_prompt, session_start)."""
    text = stdout.strip()
    if not text:
        return ""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        context = value.get("additional_context")
        text = context.strip() if isinstance(context, str) else ""
    elif event not in ("user_prompt", "session_start"):
        return ""
    return _capped(text, CONTEXT_LIMIT)[0]


def judge(hook: Hook, result: HookResult) -> Ran:
    if result.error is not None:
        return Ran(hook, "warning", problem=f"did not run: {result.error}")
    if result.timed_out:
        return Ran(hook, "timeout", problem=f"timed out after {hook.timeout:g} s and was killed")
    if result.cancelled:
        return Ran(hook, "warning", problem="stopped: the task was interrupted", interrupted=True)
    stderr = result.stderr.strip()
    if result.exit_code == 0:
        return Ran(hook, "allowed", context=context_of(result.stdout, hook.event))
    if result.exit_code == 2 and hook.event not in CANNOT_BLOCK:
        return Ran(hook, "blocked", reason=stderr or "(the hook gave no reason on stderr)")
    if result.signal is not None:
        what = f"was killed by signal {result.signal}"
    elif result.exit_code == 2:
        what = f"exited with 2, which cannot block at {hook.event}"
    else:
        what = f"exited with status {result.exit_code}"
    tail = "\n".join(stderr.splitlines()[-5:])
    return Ran(hook, "warning", problem=f"{what}: {tail}" if tail else what)


class Hooks:
    """A session's hooks, run at the five events."""

    def __init__(
        self,
        hooks: Sequence[Hook],
        *,
        workspace: Path,
        session_id: str,
        emit: Callable[[Event], Any],
        approval: Callable[[], ApprovalMode],
        sandbox: CommandSandbox | None = None,
        settings: SandboxSettings | None = None,
        cancel: threading.Event | None = None,
        notices: Sequence[Notice] = (),
        guard: ScriptGuard | None = None,
    ) -> None:
        self.hooks = list(hooks)
        # The repository's trusted scripts, hashed again before each of its hooks runs.
        self.guard = guard
        self.workspace = workspace
        self.session_id = session_id
        self.emit = emit
        self.approval = approval
        self.sandbox = sandbox
        self.settings = settings or SandboxSettings()
        self.cancel = cancel
        self.notices = list(notices)
        self._pending: list[str] = []  # session_start context, for the first prompt
        self._continuations = 0  # stop hooks that sent this task back to work

    def for_child(
        self,
        emit: Callable[[Event], Any],
        approval: Callable[[], ApprovalMode],
        cancel: threading.Event | None = None,
    ) -> Hooks | None:
        """A subagent's hooks: the same pre_tool and post_tool hooks (a guard must hold for
        delegated calls too), reporting to the child's stream; no prompt, stop or session
        hooks (those belong to the user's task). None when there are no tool hooks."""
        tool_hooks = [hook for hook in self.hooks if hook.event in TOOL_EVENTS]
        if not tool_hooks:
            return None
        return Hooks(
            tool_hooks,
            workspace=self.workspace,
            session_id=self.session_id,
            emit=emit,
            approval=approval,
            sandbox=self.sandbox,
            settings=self.settings,
            cancel=cancel,
            guard=self.guard,
        )

    # -- the five events ---------------------------------------------------------------

    async def session_start(self, resumed: bool) -> None:
        """Tell the user what of the config did not load or run, then run the hooks."""
        for notice in self.notices:
            self.emit(ErrorEvent(message=notice.message, kind=notice.kind))
        for ran in await self._run("session_start", {"resumed": resumed}):
            if ran.context:
                self._pending.append(for_model(ran.hook, ran.context))

    async def user_prompt(self, prompt: str, content: str | None = None) -> PromptVerdict:
        """Called when a task starts: the message to send (`content`, the prompt as the
        model gets it, followed by the hooks' context), or why none is sent."""
        self._continuations = 0
        notes, self._pending = self._pending, []
        for ran in await self._run("user_prompt", {"prompt": prompt}, stop_on_block=True):
            if ran.outcome == "blocked":
                self._pending = notes  # session context still waits for a prompt
                message = (
                    f"Your prompt was not sent: the user_prompt hook {ran.hook.name!r} "
                    f"blocked it: {ran.reason}"
                )
                self.emit(ErrorEvent(message=message, kind="hook"))
                return PromptVerdict(content="", blocked=message)
            if ran.context:
                notes.append(for_model(ran.hook, ran.context))
        return PromptVerdict(content="\n\n".join([prompt if content is None else content, *notes]))

    async def pre_tool(self, tool: str, arguments: dict[str, Any], call_id: str) -> ToolVerdict:
        """After the permission policy let the call through, before anyone is asked."""
        data = {"tool": {"name": tool, "arguments": arguments, "call_id": call_id}}
        notes: list[str] = []
        for ran in await self._run("pre_tool", data, tool, call_id, stop_on_block=True):
            if ran.outcome == "blocked":
                return ToolVerdict(
                    blocked=f"Blocked by the pre_tool hook {ran.hook.name!r}; the call was not "
                    f"run. The hook said:\n{ran.reason}"
                )
            if ran.interrupted:
                return ToolVerdict(blocked="Not run: the user interrupted the task.")
            if ran.context:
                notes.append(for_model(ran.hook, ran.context))
        return ToolVerdict(notes=tuple(notes))

    async def post_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        call_id: str,
        result: ToolResult,
        notes: Sequence[str] = (),
    ) -> ToolResult:
        """The result the model sees: the tool's, with what the hooks add after it."""
        output, cut = _capped(result.output, PAYLOAD_TEXT_LIMIT)
        data = {
            "tool": {"name": tool, "arguments": arguments, "call_id": call_id},
            "result": {"ok": result.ok, "output": output, "truncated": result.truncated or cut},
        }
        added = list(notes)
        for ran in await self._run("post_tool", data, tool, call_id):
            text = ran.reason if ran.outcome == "blocked" else ran.context
            if text:
                added.append(for_model(ran.hook, text))
        if not added:
            return result
        return result.model_copy(update={"output": "\n\n".join([result.output, *added])})

    async def stop(self, final_message: str) -> str | None:
        """The model answered and the task would end: a user note to go on with, or None."""
        message, _ = _capped(final_message, PAYLOAD_TEXT_LIMIT)
        data = {"final_message": message, "continuations": self._continuations}
        for ran in await self._run("stop", data, stop_on_block=True):
            if ran.outcome != "blocked":
                continue
            if self._continuations >= MAX_STOP_CONTINUATIONS:
                self.emit(
                    ErrorEvent(
                        message=f"the stop hook {ran.hook.name!r} asked to go on again; the "
                        f"task ends: stop hooks may continue a task {MAX_STOP_CONTINUATIONS} "
                        "times",
                        kind="hook",
                    )
                )
                return None
            self._continuations += 1
            return for_model(ran.hook, f"The task is not finished yet:\n{ran.reason}")
        return None

    # -- running -------------------------------------------------------------------------

    async def _run(
        self,
        event: str,
        data: dict[str, Any],
        tool: str | None = None,
        call_id: str = "",
        stop_on_block: bool = False,
    ) -> list[Ran]:
        chosen = [h for h in self.hooks if h.event == event and h.matches(tool)]
        if any(h.source == "repository" for h in chosen) and self._scripts_changed():
            chosen = [h for h in chosen if h.source != "repository"]
        if not chosen:
            return []
        mode = self.approval()
        payload = {
            "event": event,
            "session_id": self.session_id,
            "workspace": str(self.workspace),
            "approval": mode.value,
            **data,
        }
        # valid Unicode whatever the payload holds (a file name that is not UTF-8, say)
        stdin = (json_text(payload, default=str) + "\n").encode()
        variables = {
            "RESIDENT_HOOK_EVENT": event,
            "RESIDENT_SESSION_ID": self.session_id,
            "RESIDENT_WORKSPACE": str(self.workspace),
        }
        done: list[Ran] = []
        for hook in chosen:
            confinement = self._confinement(hook, mode)
            result = await run_hook(
                hook, self.workspace, confinement, stdin, variables, self.cancel
            )
            ran = judge(hook, result)
            self._report(ran, result, tool or "", call_id)
            done.append(ran)
            if ran.interrupted or (stop_on_block and ran.outcome == "blocked"):
                break  # the user stopped the task, or the answer is already no
        return done

    def _scripts_changed(self) -> bool:
        """Whether a script the repository's hooks run changed since it was trusted; if so
        they are dropped for the rest of the session, and the person told once."""
        problem = self.guard.problem() if self.guard is not None else None
        if problem is None:
            return False
        self.hooks = [h for h in self.hooks if h.source != "repository"]
        self.guard = None
        self.emit(ErrorEvent(message=problem, kind="hook_trust"))
        return True

    def _confinement(self, hook: Hook, mode: ApprovalMode) -> Confinement:
        """A repository's hook runs in the sandbox with no more than a command the agent
        could run unasked in this mode: a writable workspace only in full-auto, the network
        only with --network, secret files masked."""
        if hook.source == "user":
            return Confinement()
        if self.sandbox is None:  # active.py never lets one through; fail closed anyway
            raise RuntimeError("a repository hook cannot run without the sandbox")
        grant = SandboxGrant(write=mode is ApprovalMode.FULL_AUTO)
        return Confinement(self.sandbox, grant, self.settings)

    def _report(self, ran: Ran, result: HookResult, tool: str, call_id: str) -> None:
        message = ran.reason or ran.problem or ran.context
        self.emit(
            HookRun(
                name=ran.hook.name,
                hook_event=ran.hook.event,  # type: ignore[arg-type]
                command=ran.hook.command,
                source=ran.hook.source,
                outcome=ran.outcome,
                duration_s=round(result.duration_s, 3),
                message=message,
                tool=tool,
                call_id=call_id,
            )
        )
        if ran.outcome in ("warning", "timeout") and not ran.interrupted:
            where = f"{ran.hook.source} hook {ran.hook.name!r} ({ran.hook.event})"
            self.emit(ErrorEvent(message=f"{where} {ran.problem}", kind="hook"))
