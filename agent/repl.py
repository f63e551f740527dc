"""`resident --plain` (or `resident` on a pipe): the agent on this repository, line by line.

A front end like headless (agent/headless.py) and the TUI (agent/tui/), over
the same runtime and event stream. It holds no agent logic: it
renders events, sends each line as a user message of one continuing
session, answers approvals on the terminal and turns Ctrl-C into interrupts.

Two threads: the terminal (prompts, approval questions, Ctrl-C) is the main
thread, so a blocking `input()` never stands in the agent's way and Ctrl-C
arrives as KeyboardInterrupt where it is read; the agent runs on an asyncio
loop in a second thread (agent/agent_thread.py). Approval requests cross over
through a queue; what the commands do is shared with the TUI (agent/core/commands.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

from agent.agent_thread import AgentThread
from agent.core.clients import ClientError, LLMClient
from agent.core.commands import (
    SessionApprovals,
    mcp_report,
    reopen_runtime,
    set_approval_mode,
    undo_summary,
)
from agent.core.custom_commands import CustomCommand, CustomCommands
from agent.core.events import Event, SessionCompleted, Usage
from agent.core.loop import TaskOutcome
from agent.core.plan_mode import PLAN_CHOICES, PlanChoice, proceed
from agent.core.runtime import Runtime, RuntimeOptions, UnknownToolError, open_runtime
from agent.core.session import SessionNotFound
from agent.core.settings_report import session_settings
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest
from agent.event_printers import ProgressPrinter
from agent.exit_codes import EXIT_INTERRUPTED, EXIT_USAGE, error_exit_code
from agent.terminal_text import terminal_safe
from tools import ApprovalMode

T = TypeVar("T")
PROMPT = "> "
APPROVAL_PROMPT = "  allow? [y]es once, [a]llow for this session, [n]o: "
REASON_PROMPT = "  reason for the model (optional): "
PLAN_PROMPT = (
    "  carry out this plan? "
    + ", ".join(f"[{n}] {c.label.lower()}" for n, c in enumerate(PLAN_CHOICES, start=1))
    + " (Enter keeps planning): "
)
BANNER = (
    "Type a task and press Enter. /help lists commands; Ctrl-C interrupts; Ctrl-D or /quit leaves."
)
HELP = """\
Each line is a message to the agent, in one continuing session.
  /help      this list
  /compact   summarize the conversation so far (keeps the repository resident)
  /undo      put files and conversation back as they were before the last change
  /clear     start a new session
  /plan      plan mode: the agent explores read-only and proposes a plan to approve;
             `/plan TASK` plans TASK right away
  /mcp       MCP servers: their state and tools
  /settings  the session's settings, and the engine settings the agent chooses
  /quit      leave (also Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C while the agent works stops generation and any running command; a
second Ctrl-C stops at once. Approvals: y allows the call once, a allows the
same request for the rest of the session, n denies it (add a reason for the
model after the n, or on the next line)."""
CUSTOM_HELP = "Custom commands (.resident/commands/ in the repository, commands/ in your config):"


def custom_help(commands: Sequence[CustomCommand]) -> list[str]:
    """/help's lines for the custom commands; none when there are none."""
    if not commands:
        return []
    names = [c.slash_name + (f" {c.argument_hint}" if c.argument_hint else "") for c in commands]
    width = max(len(n) for n in names)
    rows = zip(names, commands, strict=True)
    return [CUSTOM_HELP] + [f"  {name.ljust(width)}  {c.description}" for name, c in rows]


class ReplPrinter(ProgressPrinter):
    """Progress as headless shows it, on stdout, without the per-turn token counts."""

    def __call__(self, event: Event) -> None:
        if isinstance(event, Usage):
            return
        super().__call__(event)

    def end_line(self) -> None:
        if self._mid_line:
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False


class Repl:
    def __init__(
        self,
        options: RuntimeOptions,
        out: TextIO | None = None,
        client: LLMClient | None = None,
        read_line: Callable[[str], str] = input,
    ) -> None:
        self.options = options
        self.out = out or sys.stdout
        self.client = client
        self.read_line = read_line
        self.printer = ReplPrinter(self.out)
        self.worker: AgentThread | None = None
        self.runtime: Runtime | None = None
        self.approvals: queue.Queue[tuple[ApprovalRequest, concurrent.futures.Future]] = (
            queue.Queue()
        )
        self.allowed = SessionApprovals()
        self.last_message = ""
        self.commands = CustomCommands(Path(options.workspace))

    # -- terminal ------------------------------------------------------------------

    def say(self, text: str) -> None:
        """A line (or lines) for the person; much of it names what a repository or a model
        wrote (commands, problems, MCP servers), so control characters are shown as text."""
        self.printer.end_line()
        self.out.write(terminal_safe(text) + "\n")
        self.out.flush()

    def _read(self, prompt: str) -> str | None:
        """A line from the terminal; None at end of input."""
        self.printer.end_line()
        try:
            return self.read_line(prompt)
        except EOFError:
            self.out.write("\n")
            self.out.flush()
            return None

    # -- the session ---------------------------------------------------------------

    def run(self) -> int:
        self.worker = AgentThread()
        try:
            try:
                self.runtime = self.worker.run(self._open(self.options, self.client))
            except ClientError as problem:
                self.say(f"error: {problem}")
                return error_exit_code(problem.kind)
            except (SessionNotFound, UnknownToolError) as problem:
                self.say(f"error: {problem}")
                return EXIT_USAGE
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
            self.say(BANNER)
            self._tell(self.commands.new_problems())
            try:
                return self._prompt_loop()
            finally:
                self._finish()
        finally:
            self.worker.stop()

    async def _open(self, options: RuntimeOptions, client: LLMClient | None) -> Runtime:
        return await open_runtime(options, [self.printer], self._approve, client, "")

    def _finish(self) -> None:
        runtime, worker = self.runtime, self.worker
        if runtime is None or worker is None:
            return

        async def close() -> None:
            runtime.emitter.emit(SessionCompleted(final_message=self.last_message, exit_code=0))
            await runtime.close()

        with contextlib.suppress(Exception, KeyboardInterrupt):
            worker.submit(close()).result(timeout=30)

    def _prompt_loop(self) -> int:
        armed = False  # Ctrl-C pressed once at the prompt
        while True:
            try:
                line = self._read(PROMPT)
            except KeyboardInterrupt:
                if armed:
                    self.say("")
                    return 0
                armed = True
                self.say("\n(Ctrl-C again, Ctrl-D or /quit to leave)")
                continue
            armed = False
            if line is None:
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self._command(line):
                    return 0
                continue
            self._task(line)

    def _command(self, line: str) -> bool:
        """Run a slash command; False when it is time to leave."""
        name = line.split()[0].lower()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            discovery = self.commands.discover()
            self._tell(self.commands.new_problems(discovery))
            self.say("\n".join([HELP, *custom_help(discovery.commands)]))
        elif name == "/compact":
            done = self._work(self._agent().compact())
            self.say("[compacted]" if done else "[nothing was compacted]")
        elif name == "/undo":
            report = self._work(self._agent().undo())
            first, *rest = undo_summary(report)
            self.say(f"[{first[0].lower()}{first[1:].rstrip('.')}]")
            for detail in rest:
                if detail.startswith("warning:"):
                    self.say(f"  {detail}")
        elif name == "/clear":
            self._new_session()
        elif name == "/plan":
            set_approval_mode(self._agent(), ApprovalMode.PLAN)
            self.say("[plan mode: read-only exploration, then a plan for you to approve]")
            task = line.split(maxsplit=1)[1:]
            if task:
                self._task(task[0].strip())
        elif name == "/settings":
            assert self.runtime is not None
            lines = self._work(session_settings(self.runtime, self.options), interruptible=False)
            self.say("\n".join(lines or []))
        elif name == "/mcp":
            assert self.runtime is not None
            for text in mcp_report(self.runtime):
                self.say(text)
        else:
            self._custom(line, name)
        return True

    def _tell(self, problems: list[str]) -> None:
        for problem in problems:
            self.say(f"warning: {problem}")

    def _custom(self, line: str, name: str) -> None:
        """A custom command: its expansion runs as the task, the typed line is shown."""
        discovery = self.commands.discover()
        self._tell(self.commands.new_problems(discovery))
        invocation = self.commands.invocation(line, discovery)
        if invocation is None:
            self.say(f"unknown command {name}; /help lists them")
            return
        self._task(invocation.prompt, shown=invocation.typed)

    def _agent(self):
        assert self.runtime is not None
        return self.runtime.agent

    def _new_session(self) -> None:
        assert self.runtime is not None and self.worker is not None
        old = self.runtime

        async def reopen() -> Runtime:
            return await reopen_runtime(
                old, self.options, [self.printer], self._approve, self.last_message
            )

        self.allowed.clear()
        self.last_message = ""
        self.runtime = self._work(reopen(), interruptible=False) or old

    # -- one task --------------------------------------------------------------------

    def _task(self, text: str, shown: str | None = None) -> None:
        outcome: TaskOutcome | None = self._work(self._agent().run_task(text, shown))
        if outcome is None:
            return
        self.last_message = outcome.final_message
        if outcome.reason == "interrupted":
            self.say("[interrupted]")
        elif outcome.plan:
            self._after_plan()

    def _after_plan(self) -> None:
        """Plan mode proposed a plan: carry it out in the mode chosen, or keep planning."""
        choice = self._choose_plan()
        if not choice.proceeds:
            self.say("[still in plan mode: type what to change in the plan]")
            return
        follow_up = proceed(self._agent(), choice.mode)
        self.say(f"[approval mode is now {choice.mode.value}; carrying out the plan]")
        self._task(follow_up)

    def _choose_plan(self) -> PlanChoice:
        keep_planning = PLAN_CHOICES[-1]
        while True:
            try:
                reply = self._read(PLAN_PROMPT)
            except KeyboardInterrupt:
                return keep_planning
            if reply is None or not reply.strip():
                return keep_planning
            word = reply.strip().lower()
            for number, choice in enumerate(PLAN_CHOICES, start=1):
                if word in (str(number), choice.mode.value):
                    return choice
            self.say(f"  answer 1-{len(PLAN_CHOICES)}, or Enter to keep planning")

    def _work(self, coro: Coroutine[Any, Any, T], interruptible: bool = True) -> T | None:
        """Run agent work, answering its approval questions, until it ends.

        Ctrl-C once interrupts the agent (it stops cleanly); twice abandons
        the work. None when it was abandoned or failed.
        """
        assert self.worker is not None
        future = self.worker.submit(coro)
        presses = 0
        while not future.done():
            try:
                try:
                    request, answer = self.approvals.get(timeout=0.05)
                except queue.Empty:
                    continue
                try:
                    answer.set_result(self._ask(request))
                except KeyboardInterrupt:
                    answer.set_result(ApprovalAnswer(False, "The user interrupted the task."))
                    raise
            except KeyboardInterrupt:
                presses += 1
                if presses == 1 and interruptible:
                    self.worker.call(self._agent().interrupt)
                    self.say("\n[interrupting; Ctrl-C again to stop at once]")
                else:
                    future.cancel()
                    self.say("\n[stopped]")
                    return None
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            self.say("[stopped]")
        except Exception as problem:  # the agent failed; the session goes on
            self.say(f"error: {problem}")
        return None

    async def _approve(self, request: ApprovalRequest) -> ApprovalAnswer:
        """The runtime's approval callback (agent thread): ask the terminal thread."""
        if self.allowed.allows(request):
            return ApprovalAnswer(True, "allowed for this session")
        answer: concurrent.futures.Future[ApprovalAnswer] = concurrent.futures.Future()
        self.approvals.put((request, answer))
        return await asyncio.wrap_future(answer)

    def _ask(self, request: ApprovalRequest) -> ApprovalAnswer:
        while True:
            reply = self._read(APPROVAL_PROMPT)
            if reply is None:
                return ApprovalAnswer(False, "")
            choice, _, reason = reply.strip().partition(" ")
            choice = choice.lower()
            if choice in ("y", "yes"):
                return ApprovalAnswer(True)
            if choice in ("a", "always"):
                self.allowed.remember(request)
                return ApprovalAnswer(True, "allowed for this session")
            if choice in ("n", "no"):
                reason = reason.strip()
                if not reason:
                    reason = (self._read(REASON_PROMPT) or "").strip()
                return ApprovalAnswer(False, reason)
            self.say("  answer y, a or n")


def run_repl(options: RuntimeOptions, client: LLMClient | None = None) -> int:
    """The interactive agent; returns the exit code (0 when the user leaves)."""
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    return Repl(options, client=client).run()
