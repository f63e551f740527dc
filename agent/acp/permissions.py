"""Approvals as ACP permission requests: the options offered and what each answer means.

The agent asks through its approval callback (agent.tool_runner); here that
question becomes `session/request_permission` with four options, mapped
onto the agent's answers as the REPL and the TUI map their keys:

- allow once: this call runs;
- allow always: this call runs, and the same request by the same tool is
  not asked again in this session (the REPL's "a");
- reject once: this call does not run; the model is told it was denied;
- reject always: as reject once, and the same request is denied without
  asking for the rest of the session.

"Always" lasts as long as the session is open in this process; nothing is
written to the user's rules. A `cancelled` outcome (the client cancelled the
prompt turn) is a denial.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from acp import text_block, tool_content
from acp.schema import (
    AllowedOutcome,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from agent.acp.tool_calls import ToolContent, tool_kind, tool_title
from agent.core.commands import SessionApprovals
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest

ALLOW_ONCE = "allow-once"
ALLOW_ALWAYS = "allow-always"
REJECT_ONCE = "reject-once"
REJECT_ALWAYS = "reject-always"
OPTIONS: tuple[PermissionOption, ...] = (
    PermissionOption(option_id=ALLOW_ONCE, name="Allow once", kind="allow_once"),
    PermissionOption(option_id=ALLOW_ALWAYS, name="Allow for this session", kind="allow_always"),
    PermissionOption(option_id=REJECT_ONCE, name="Reject", kind="reject_once"),
    PermissionOption(option_id=REJECT_ALWAYS, name="Reject for this session", kind="reject_always"),
)
# A change to Resident's configuration is asked for every time: no "always" to offer.
ONCE_OPTIONS: tuple[PermissionOption, ...] = (OPTIONS[0], OPTIONS[2])
ALLOWED_FOR_SESSION = "allowed for this session"
REJECTED_FOR_SESSION = "The user rejected this request for the rest of the session."
CANCELLED = "The user cancelled the turn."

# Sends the request to the client and returns its answer.
AskClient = Callable[[ToolCallUpdate, list[PermissionOption]], Awaitable[RequestPermissionResponse]]


def permission_tool_call(request: ApprovalRequest, content: list[ToolContent]) -> ToolCallUpdate:
    """The tool call as the permission request shows it: what it would do and why it asks."""
    why = f"Needs approval: {request.request} ({request.reason})."
    return ToolCallUpdate(
        tool_call_id=request.call_id,
        title=tool_title(request.tool, request.arguments),
        kind=tool_kind(request.tool),
        status="pending",
        content=[*content, tool_content(text_block(why))],
        raw_input=request.arguments,
    )


class PermissionBridge:
    """One session's approvals: remembered answers first, then the client."""

    def __init__(self, ask: AskClient) -> None:
        self.ask = ask
        self.allowed = SessionApprovals()
        self._rejected: set[tuple[str, str]] = set()

    def remembered(self, request: ApprovalRequest) -> ApprovalAnswer | None:
        if self.allowed.allows(request):
            return ApprovalAnswer(True, ALLOWED_FOR_SESSION)
        if (request.tool, request.request) in self._rejected:
            return ApprovalAnswer(False, REJECTED_FOR_SESSION)
        return None

    async def approve(self, request: ApprovalRequest, content: list[ToolContent]) -> ApprovalAnswer:
        answer = self.remembered(request)
        if answer is not None:
            return answer
        offered = ONCE_OPTIONS if request.once else OPTIONS
        response = await self.ask(permission_tool_call(request, content), list(offered))
        return self.answer(request, response)

    def answer(
        self, request: ApprovalRequest, response: RequestPermissionResponse
    ) -> ApprovalAnswer:
        outcome = response.outcome
        if not isinstance(outcome, AllowedOutcome):  # "cancelled"
            return ApprovalAnswer(False, CANCELLED)
        choice = outcome.option_id
        if choice == ALLOW_ONCE:
            return ApprovalAnswer(True)
        if choice == ALLOW_ALWAYS and not request.once:
            self.allowed.remember(request)
            return ApprovalAnswer(True, ALLOWED_FOR_SESSION)
        if choice == REJECT_ALWAYS:
            self._rejected.add((request.tool, request.request))
            return ApprovalAnswer(False, REJECTED_FOR_SESSION)
        return ApprovalAnswer(False)  # reject once, or an option we never offered
