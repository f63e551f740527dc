"""What the interactive front ends' slash commands do, with no display of their own.

The line REPL (agent/repl.py) and the TUI (agent/tui/) both call these and
only show the results, so a command behaves the same in either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.core.config import setting_choices
from agent.core.events import EventSink, SessionCompleted
from agent.core.loop import Agent
from agent.core.mcp.report import status_lines
from agent.core.runtime import Runtime, RuntimeOptions, open_runtime
from agent.core.session import SessionMeta, SessionStore
from agent.core.tool_runner import ApprovalCallback, ApprovalRequest
from tools import ApprovalMode, RestoreReport
from tools.git.tool import GitDiffArgs, GitDiffTool


@dataclass(frozen=True)
class SlashCommand:
    name: str
    usage: str  # arguments, e.g. "[MODE]"
    help: str


SLASH_COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand("/help", "", "commands and keys"),
    SlashCommand("/model", "[NAME]", "the model and engine; with NAME, switch to that model"),
    SlashCommand("/context", "", "what is resident: files and their tokens"),
    SlashCommand("/compact", "", "summarize the conversation (the repository stays resident)"),
    SlashCommand("/undo", "", "files and conversation back to before the last change"),
    SlashCommand("/diff", "", "uncommitted changes in the repository"),
    SlashCommand("/clear", "", "start a new session"),
    SlashCommand("/sessions", "", "this repository's sessions; pick one to resume"),
    SlashCommand("/approval", "[MODE]", "show or set the approval mode"),
    SlashCommand(
        "/settings", "", "the session's settings, and the engine settings the agent chooses"
    ),
    SlashCommand(
        "/plan", "[TASK]", "plan mode: explore read-only, propose a plan; with TASK, plan it"
    ),
    SlashCommand("/mcp", "", "MCP servers: their state and tools"),
    SlashCommand("/quit", "", "leave"),
)
# `/approval`'s choices (its help and completion): the declared setting's, never a copy.
APPROVAL_MODES: tuple[str, ...] = setting_choices("approval") or ()


def find_command(name: str) -> SlashCommand | None:
    name = name.lower()
    if name == "/exit":
        name = "/quit"
    return next((c for c in SLASH_COMMANDS if c.name == name), None)


class SessionApprovals:
    """Answers of "allow for this session": the same request by the same tool is not
    asked again. A request marked `once` (a change to Resident's configuration) is
    neither covered nor remembered: it is asked for by name every time."""

    def __init__(self) -> None:
        self._allowed: set[tuple[str, str]] = set()

    def allows(self, request: ApprovalRequest) -> bool:
        return not request.once and (request.tool, request.request) in self._allowed

    def remember(self, request: ApprovalRequest) -> None:
        if not request.once:
            self._allowed.add((request.tool, request.request))

    def clear(self) -> None:
        self._allowed.clear()


def undo_summary(report: RestoreReport | None) -> list[str]:
    """What `/undo` did, in lines for a person; the first line says it all."""
    if report is None:
        return ["Nothing to undo in this session."]
    changed = len(report.written) + len(report.deleted)
    noun = "file" if changed == 1 else "files"
    lines = [f"Undone: back to checkpoint {report.checkpoint.id}, {changed} {noun} restored."]
    lines += [f"restored {path}" for path in report.written]
    lines += [f"deleted {path}" for path in report.deleted]
    lines += [f"warning: {problem}" for problem in report.problems]
    return lines


async def reopen_runtime(
    runtime: Runtime,
    options: RuntimeOptions,
    sinks: list[EventSink],
    approve: ApprovalCallback | None,
    final_message: str = "",
    *,
    resume: str | None = None,
    model: str | None = None,
) -> Runtime:
    """End `runtime`'s session and open another on the same workspace.

    No `resume`: a new session (`/clear`); `resume`: that session, its
    conversation restored (`/sessions`). `model`: a new client for that model
    (`/model NAME`); otherwise the engine connection is kept. When opening
    fails the old runtime stays usable and the error is raised.
    """
    runtime.emitter.emit(SessionCompleted(final_message=final_message, exit_code=0))
    await runtime.stop_mcp()  # a new session starts its own
    runtime.session.close()
    fresh = replace(options, resume=resume, continue_last=False)
    if model is not None:
        fresh = replace(fresh, model=model)
    client = runtime.client if model is None else None
    opened = await open_runtime(fresh, sinks, approve, client, "")
    if model is not None:
        await runtime.client.aclose()
    return opened


def set_approval_mode(agent: Agent, mode: ApprovalMode) -> ApprovalMode:
    """Change how tool calls are approved from now on.

    Takes the mode, not text: the front end parses what the person typed
    (`/approval MODE`, ACP's mode id) with ApprovalMode.parse, whose
    ValueError names the modes; a string here is refused (TypeError)."""
    agent.approval_mode = mode
    return mode


def approval_mode(agent: Agent) -> ApprovalMode:
    return agent.approval_mode


@dataclass(frozen=True)
class WorkspaceDiff:
    ok: bool
    text: str  # a unified diff, or why there is none


def workspace_diff(agent: Agent) -> WorkspaceDiff:
    """Uncommitted changes of the workspace against HEAD, through the git_diff tool."""
    result = GitDiffTool().run(GitDiffArgs(ref="HEAD"), agent.tools.ctx)
    return WorkspaceDiff(result.ok, result.output)


def list_sessions(agent: Agent, store: SessionStore | None = None) -> Sequence[SessionMeta]:
    """This workspace's sessions, most recent first."""
    return (store or SessionStore()).list(agent.context.workspace)


def mcp_report(runtime: Runtime) -> list[str]:
    """`/mcp`: the session's MCP servers, their state and the tools they offer."""
    if runtime.mcp is None:
        return status_lines([], [])
    statuses = runtime.mcp.statuses()
    lines = status_lines(statuses, runtime.mcp.problems)
    offered = set(runtime.mcp.catalog.offered())
    ready = {tool.name for status in statuses for tool in status.tools if status.ready}
    waiting = len(ready - offered)
    noun = "tool is" if len(offered) == 1 else "tools are"
    line = f"{len(offered)} MCP {noun} offered to the model now"
    lines.append(line + (f"; {waiting} more join at the next turn." if waiting else "."))
    return lines
