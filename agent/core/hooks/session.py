"""The runtime's entry point: a session's `Hooks`, or None when no hooks file exists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core.events import Event
from agent.core.hooks.active import active_hooks, configured_hooks
from agent.core.hooks.dispatch import Hooks
from agent.core.hooks.trust import HookTrust
from tools import ApprovalMode, ToolContext


def open_hooks(
    workspace: Path,
    tool_context: ToolContext,
    approval: Callable[[], ApprovalMode],
    session_id: str,
    emit: Callable[[Event], Any],
    trust: HookTrust | None = None,
) -> Hooks | None:
    """The session's hooks, not yet started (`Hooks.session_start` tells the user what
    did not load and runs the session_start hooks). None: no hooks file, nothing to run
    or report, and the loop skips every hook point."""
    config = configured_hooks(workspace)
    if config is None:
        return None
    sandbox = tool_context.sandbox
    active = active_hooks(config, workspace, sandboxed=sandbox is not None, trust=trust)
    return Hooks(
        active.hooks,
        workspace=workspace,
        session_id=session_id,
        emit=emit,
        approval=approval,
        sandbox=sandbox,
        settings=tool_context.sandbox_settings,
        cancel=tool_context.cancel_event,
        notices=active.notices,
        guard=active.guard,
    )
