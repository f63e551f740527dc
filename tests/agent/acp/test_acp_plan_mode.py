"""Plan mode over ACP: a session mode like the others, a plan sent as the agent's message.

`resident acp` runs as a child process, the model a scripted server. The client
switches to `plan`, gets a plan (a write attempted meanwhile is refused without
a permission request), switches to `auto-edit` itself and has it carried out.
"""

from __future__ import annotations

import asyncio

import pytest
from acp import text_block

import prompts
from agent.acp.updates import PLAN_NOTE
from tests.agent.acp.acp_client import EditorClient, resident_acp, stderr_of
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tools import ApprovalMode

pytestmark = pytest.mark.anyio

PLAN = "1. Change `add` in calc.py to return a + b.\n2. Run the tests."
EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
WRITE = call("write", path="notes.txt", content="scratch")
TIMEOUT = 60


async def prompt(conn, session_id: str, text: str):
    return await asyncio.wait_for(
        conn.prompt(session_id=session_id, prompt=[text_block(text)]), TIMEOUT
    )


async def test_plan_mode_is_a_session_mode_and_its_plan_the_agents_message(repo):
    client = EditorClient()
    script = [Reply("", [WRITE]), Reply(PLAN), Reply("", [EDIT]), Reply("Done.")]
    with ScriptedServer(script) as server:
        async with resident_acp(client, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            modes = {m.id: m for m in session.modes.available_modes}
            assert "plan" in modes and modes["plan"].name == ApprovalMode.PLAN.label
            assert modes["plan"].description == ApprovalMode.PLAN.description
            sid = session.session_id
            await agent.conn.set_session_mode(session_id=sid, mode_id="plan")
            planned = await prompt(agent.conn, sid, "fix add")
            plan_text = client.text()
            asked_while_planning = len(client.permission_requests)
            await agent.conn.set_session_mode(session_id=sid, mode_id="auto-edit")
            done = await prompt(agent.conn, sid, "Go ahead.")
    assert agent.process.returncode == 0, stderr_of(repo)
    assert planned.stop_reason == "end_turn" and done.stop_reason == "end_turn"
    # The plan is the agent's message, then how to carry it out.
    assert plan_text == PLAN + PLAN_NOTE
    assert "switch the mode to Ask, Auto-edit or Full auto" in PLAN_NOTE
    # Planning: the model was told, the write refused without asking anyone.
    instruction = prompts.load("plan_mode").strip()
    assert server.requests[0]["messages"][-1]["content"] == f"fix add\n\n{instruction}"
    refused = server.requests[1]["messages"][-1]
    assert refused["role"] == "tool" and "plan mode does not allow changes" in refused["content"]
    assert asked_while_planning == 0 and not (repo / "notes.txt").exists()
    # After the client's switch: the edit ran unasked, the plan in the conversation.
    assert len(client.permission_requests) == 0
    assert "return a + b" in (repo / "calc.py").read_text()
    carried = server.requests[2]["messages"]
    assert carried[-1] == {"role": "user", "content": "Go ahead."}
    assert {"role": "assistant", "content": PLAN} in carried
