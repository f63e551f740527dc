"""An approval to change Resident's configuration covers that one call: no front end
remembers it for the session (the REPL's and TUI's `a`, ACP's "allow always")."""

from __future__ import annotations

import pytest
from acp.schema import AllowedOutcome, RequestPermissionResponse

from agent.acp.permissions import ALLOW_ALWAYS, PermissionBridge
from agent.core.commands import SessionApprovals
from agent.core.tool_runner import ApprovalRequest

ONCE = ApprovalRequest("c1", "write", "Write .resident/mcp.json", "asked by name", once=True)
PLAIN = ApprovalRequest("c2", "write", "Write a.py", "ask mode")


def test_a_once_request_is_never_remembered_for_the_session():
    approvals = SessionApprovals()
    approvals.remember(ONCE)
    assert not approvals.allows(ONCE)
    approvals.remember(PLAIN)
    assert approvals.allows(PLAIN)


@pytest.mark.anyio
async def test_acp_offers_no_allow_always_for_configuration():
    offered: list[list[str]] = []

    async def ask(tool_call, options):
        offered.append([option.option_id for option in options])
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=ALLOW_ALWAYS)
        )

    bridge = PermissionBridge(ask)
    answer = await bridge.approve(ONCE, [])
    assert ALLOW_ALWAYS not in offered[0]
    assert not answer.approved  # an option it was not offered counts as no
    assert (await bridge.approve(PLAIN, [])).approved
    assert ALLOW_ALWAYS in offered[1]
