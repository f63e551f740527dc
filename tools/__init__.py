"""What the agent may do: files, shell, git, the web, and the permissions that govern them.

Typical use by the agent loop:

    ctx = ToolContext(workspace=Path.cwd())
    registry = default_registry()
    policy = PermissionPolicy.for_context(ctx, ApprovalMode.ASK, allow=["shell:npm test"])

    call = registry.parse(name, arguments_json, call_id)
    if isinstance(call, ToolResult):          # malformed call: the model sees the error
        ...
    decision = policy.check(call)             # allow / ask (with reason) / deny (with reason)
    result = registry.run(call, ctx)          # only once allowed or approved

`tools` imports nothing from `engine` or `agent`.
"""

import os

# GitPython refuses to import when no git executable is found; the file and
# shell tools must still work there (the git tools then report the problem).
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

# ruff: noqa: E402

from tools.base import Arguments, Effect, Registry, Tool, ToolAccess, ToolCall, ToolResult
from tools.checkpoints.protocol import (
    Change,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    RestoreReport,
)
from tools.checkpoints.store import open_checkpoint_store
from tools.context import ToolContext, ToolLimits
from tools.files.edit import EditTool
from tools.files.grep import GrepTool
from tools.files.read import ReadTool
from tools.files.search import GlobTool, ListTool
from tools.files.state import FileStamp, FileStateLedger
from tools.files.write import WriteTool
from tools.git.tool import GitCommitTool, GitDiffTool, GitLogTool, GitStatusTool
from tools.permissions.policy import ApprovalMode, Decision, PermissionPolicy, Rule, Verdict
from tools.shell.tool import ShellTool
from tools.web.tool import WebFetchTool


def default_tools() -> list[Tool]:
    return [
        ReadTool(),
        WriteTool(),
        EditTool(),
        ListTool(),
        GlobTool(),
        GrepTool(),
        ShellTool(),
        GitStatusTool(),
        GitDiffTool(),
        GitLogTool(),
        GitCommitTool(),
        WebFetchTool(),
    ]


def default_registry() -> Registry:
    """A registry holding every standard tool."""
    return Registry(default_tools())


__all__ = [
    "ApprovalMode",
    "Arguments",
    "Change",
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "Decision",
    "Effect",
    "FileStamp",
    "FileStateLedger",
    "PermissionPolicy",
    "Registry",
    "RestoreReport",
    "Rule",
    "Tool",
    "ToolAccess",
    "ToolCall",
    "ToolContext",
    "ToolLimits",
    "ToolResult",
    "Verdict",
    "default_registry",
    "default_tools",
    "open_checkpoint_store",
]
