"""Subagents: the `task` tool hands a task to a child agent that shares the resident prefix.

A child has its own conversation and runs to completion; its final answer is
the tool's result. It is offered the very same system prompt, repository
snapshot and tool schemas as its parent, so on the local engine its first
request is served from the parent's pinned KV and only its task is prefilled.
"""

from agent.core.subagents.arguments import TaskArgs
from agent.core.subagents.task_tool import SubagentLauncher, TaskTool

__all__ = ["SubagentLauncher", "TaskArgs", "TaskTool"]
