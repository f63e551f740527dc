"""The `task` tool: a self-contained piece of work handed to a child agent.

The model gives a short description (what the user sees) and the full task.
The child gets its own conversation and the parent's tools, judged in
read-only mode unless the call asks for `write`, which the parent's policy
judges like an edit (asked in `ask` mode, refused in read-only and plan
mode); then the child works in the parent's mode. It runs to completion and
its final answer is the tool result. Read-only tasks in one answer run at
the same time, so on the local engine their requests share a batch.

Children cannot start children (the tool they get refuses), nor write to
the parent's todo list or anything else a tool keeps per agent: a tool hands
children its own `for_child()` version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from agent.core.subagents.arguments import TaskArgs
from agent.core.subagents.child import run_child
from tools import Arguments, Effect, Tool, ToolAccess, ToolCall, ToolContext, ToolResult
from tools.sandbox.grants import SandboxGrant

if TYPE_CHECKING:
    from agent.core.loop import Agent


class SubagentLauncher:
    """Starts children for one parent agent. Bound to the parent once it exists
    (the tool is in the parent's registry before the parent is built)."""

    def __init__(self) -> None:
        self.parent: Agent | None = None

    def bind(self, parent: Agent) -> None:
        self.parent = parent

    async def run(self, call_id: str, args: TaskArgs, ctx: ToolContext) -> ToolResult:
        if self.parent is None:
            return ToolResult.error("The task tool is not connected to an agent.")
        return await run_child(self.parent, call_id, args, ctx)


class TaskTool(Tool):
    name = "task"
    description = (
        "Hand a self-contained task to a subagent, which sees the repository and tools but not "
        "this conversation and returns only its final report. Good for research that would fill "
        "this conversation. Several task calls in one answer run at the same time."
    )
    effect = Effect.READ
    Args: ClassVar[type[Arguments]] = TaskArgs
    concurrent = True

    def __init__(self, launcher: SubagentLauncher | None) -> None:
        self.launcher = launcher  # None: the version children get, which refuses

    def access(self, args: Any) -> ToolAccess:
        if args.write:
            return ToolAccess(
                effect=Effect.WRITE,
                summary=f"task (may edit files and run commands): {args.description}",
            )
        return ToolAccess(effect=Effect.READ, summary=f"task: {args.description}")

    def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        return ToolResult.error("The task tool runs only inside an agent loop.")

    async def run_call(self, call: ToolCall, ctx: ToolContext, grant: SandboxGrant) -> ToolResult:
        if self.launcher is None:
            return ToolResult.error(
                "A subagent cannot start subagents of its own; do the work with your other tools."
            )
        return await self.launcher.run(call.call_id or "", call.args, ctx)

    def for_child(self) -> Tool:
        return TaskTool(None)
