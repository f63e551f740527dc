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

from __future__ import annotations

import os

# GitPython refuses to import when no git executable is found; the file and
# shell tools must still work there (the git tools then report the problem).
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

# ruff: noqa: E402

import importlib
from typing import TYPE_CHECKING

# Where each name lives, imported on first use (PEP 562): `resident serve` and the CLI's
# option types need an enum from here, and importing every tool (the shell and web
# permission rules, the HTML reader, GitPython) cost each `resident` command 0.5 s.
_HOMES = {
    "Arguments": "tools.base",
    "Effect": "tools.base",
    "Registry": "tools.base",
    "Tool": "tools.base",
    "ToolAccess": "tools.base",
    "ToolCall": "tools.base",
    "ToolResult": "tools.base",
    "Change": "tools.checkpoints.protocol",
    "Checkpoint": "tools.checkpoints.protocol",
    "CheckpointError": "tools.checkpoints.protocol",
    "CheckpointStore": "tools.checkpoints.protocol",
    "RestoreReport": "tools.checkpoints.protocol",
    "open_checkpoint_store": "tools.checkpoints.store",
    "ToolContext": "tools.context",
    "ToolLimits": "tools.context",
    "EditTool": "tools.files.edit",
    "GrepTool": "tools.files.grep",
    "ReadTool": "tools.files.read",
    "GlobTool": "tools.files.search",
    "ListTool": "tools.files.search",
    "FileStamp": "tools.files.state",
    "FileStateLedger": "tools.files.state",
    "WriteTool": "tools.files.write",
    "GitCommitTool": "tools.git.tool",
    "GitDiffTool": "tools.git.tool",
    "GitLogTool": "tools.git.tool",
    "GitStatusTool": "tools.git.tool",
    "ApprovalMode": "tools.permissions.approval",
    "Decision": "tools.permissions.policy",
    "PermissionPolicy": "tools.permissions.policy",
    "Rule": "tools.permissions.policy",
    "Verdict": "tools.permissions.policy",
    "ShellTool": "tools.shell.tool",
    "WebFetchTool": "tools.web.tool",
}

if TYPE_CHECKING:
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
    from tools.files.state import FileStamp, FileStateLedger
    from tools.permissions.approval import ApprovalMode
    from tools.permissions.policy import Decision, PermissionPolicy, Rule, Verdict


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def default_tools() -> list[Tool]:
    from tools.files.edit import EditTool
    from tools.files.grep import GrepTool
    from tools.files.read import ReadTool
    from tools.files.search import GlobTool, ListTool
    from tools.files.write import WriteTool
    from tools.git.tool import GitCommitTool, GitDiffTool, GitLogTool, GitStatusTool
    from tools.shell.tool import ShellTool
    from tools.web.tool import WebFetchTool

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
    from tools.base import Registry

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
