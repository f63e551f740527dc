"""`resident acp` driven by the ACP SDK's client side, the model a scripted server.

Each test starts the real command as a child process over stdio: a prompt
with streamed text and thought, tool calls that need permission (granted,
through the client's fs methods, and denied), a cancel mid-stream and one
mid-question, a reload of the session in a fresh process, and requests
that are wrong.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from acp import RequestError, image_block, resource_link_block, text_block
from acp.schema import AgentMessageChunk, UsageUpdate

from agent.core.session import SessionStore
from tests.agent.acp.acp_client import WAIT, EditorClient, resident_acp, stderr_of
from tests.agent.conftest import CALC
from tests.agent.scripted_server import Reply, ScriptedServer, Status, call, wait_for

pytestmark = pytest.mark.anyio

EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
TIMEOUT = 60  # one prompt against the scripted server takes well under a second


async def prompt(conn, session_id: str, text: str):
    return await asyncio.wait_for(
        conn.prompt(session_id=session_id, prompt=[text_block(text)]), TIMEOUT
    )


def user_contents(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


async def test_a_prompt_streams_text_and_thought_and_ends_the_turn(repo):
    client = EditorClient()
    script = [Reply("Hello from Resident.", reasoning="The user greets me.")]
    with ScriptedServer(script) as server:
        async with resident_acp(client, server.url, repo) as agent:
            caps = agent.init.agent_capabilities
            assert caps.load_session and caps.prompt_capabilities.embedded_context
            assert agent.init.agent_info.name == "resident"
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            assert session.modes.current_mode_id == "ask"
            assert {m.id for m in session.modes.available_modes} >= {"read-only", "full-auto"}
            response = await prompt(agent.conn, session.session_id, "hi there")
            listed = await agent.conn.list_sessions(cwd=str(repo))
        assert agent.process.returncode == 0, stderr_of(repo)  # stdin closed: a clean exit
    assert response.stop_reason == "end_turn"
    assert client.text() == "Hello from Resident."
    assert len(client.of(AgentMessageChunk)) > 1  # streamed in pieces, not at the end
    assert client.thoughts() == "The user greets me."
    assert client.user_text() == ""  # the client drew the prompt itself
    assert user_contents(server.requests[0])[-1] == "hi there"
    assert [(s.session_id, s.title) for s in listed.sessions] == [(session.session_id, "hi there")]


async def test_a_granted_edit_goes_through_the_editors_buffers(repo):
    calc = repo / "calc.py"
    unsaved = CALC.replace("return a - b", "return a - b  # unsaved")
    client = EditorClient(answers=["allow-once"], buffers={str(calc): unsaved})
    edit = call(
        "edit", path="calc.py", old_string="return a - b  # unsaved", new_string="return a + b"
    )
    script = [Reply("", [call("read", path="calc.py")]), Reply("Fixing.", [edit]), Reply("Done.")]
    with ScriptedServer(script) as server:
        async with resident_acp(client, server.url, repo, fs=True) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            response = await prompt(agent.conn, session.session_id, "fix add")
    assert response.stop_reason == "end_turn", stderr_of(repo)
    # The model read the editor's buffer, not the disk ...
    assert str(calc) in client.reads
    assert "# unsaved" in server.requests[1]["messages"][-1]["content"]
    # ... was asked about the edit, with the change to show ...
    (tool_call, options), *more = client.permission_requests
    assert not more and tool_call.kind == "edit" and tool_call.status == "pending"
    assert {o.kind for o in options} == {
        "allow_once",
        "allow_always",
        "reject_once",
        "reject_always",
    }
    fixed = unsaved.replace("return a - b  # unsaved", "return a + b")
    diff = next(c for c in tool_call.content if c.type == "diff")  # of the buffer, not the disk
    assert (diff.path, diff.old_text, diff.new_text) == (str(calc), unsaved, fixed)
    # ... and the change went to the editor, which saved it.
    assert client.writes == [(str(calc), fixed)]
    assert "return a + b" in calc.read_text()
    starts = client.tool_starts()
    assert [(s.kind, s.title) for s in starts] == [
        ("read", "Read calc.py"),
        ("edit", "Edit calc.py"),
    ]
    assert starts[0].locations[0].path == str(calc)
    final = {u.tool_call_id: u.status for u in client.tool_updates() if u.status != "in_progress"}
    assert set(final.values()) == {"completed"}
    assert client.text() == "Fixing.Done."


async def test_a_denied_edit_changes_nothing_and_the_model_is_told(repo):
    client = EditorClient(answers=["reject-once"])
    with ScriptedServer([Reply("", [EDIT]), Reply("Understood.")]) as server:
        async with resident_acp(client, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            response = await prompt(agent.conn, session.session_id, "fix add")
    assert response.stop_reason == "end_turn", stderr_of(repo)
    assert (repo / "calc.py").read_text() == CALC
    assert client.writes == []
    told = server.requests[1]["messages"][-1]
    assert told["role"] == "tool" and "denied" in told["content"]
    (update,) = [u for u in client.tool_updates() if u.status == "failed"]
    assert "denied" in update.content[0].content.text
    assert client.text() == "Understood."


async def test_cancel_stops_a_streaming_turn_and_the_session_goes_on(repo):
    client = EditorClient()
    script = [Reply("Working on it", stall=True), Reply("Still here.")]
    with ScriptedServer(script) as server:
        async with resident_acp(client, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            turn = asyncio.create_task(prompt(agent.conn, session.session_id, "slow task"))
            await asyncio.to_thread(wait_for, server.stalled, TIMEOUT)
            while "Working on it" not in client.text():
                await asyncio.sleep(0.02)
            await agent.conn.cancel(session_id=session.session_id)
            response = await turn
            again = await prompt(agent.conn, session.session_id, "are you there?")
    assert response.stop_reason == "cancelled", stderr_of(repo)
    assert again.stop_reason == "end_turn"
    assert client.text().endswith("Still here.")
    history = server.requests[1]["messages"]
    assert any("[interrupted by the user]" in (m.get("content") or "") for m in history)


async def test_closing_stdin_mid_turn_ends_the_process_cleanly(repo):
    client = EditorClient()
    with ScriptedServer([Reply("Working on it", stall=True)]) as server:
        async with resident_acp(client, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            turn = asyncio.create_task(prompt(agent.conn, session.session_id, "slow task"))
            await asyncio.to_thread(wait_for, server.stalled, TIMEOUT)
        # leaving closed its stdin with the turn still running
        await asyncio.to_thread(wait_for, server.aborted, TIMEOUT)  # the request was dropped
    assert agent.process.returncode == 0, stderr_of(repo)
    with pytest.raises(ConnectionError):
        await turn
    events = SessionStore().open(session.session_id).load_events()
    assert events[-1].type == "session_completed"


async def test_cancel_while_asking_permission_denies_the_call(repo):
    client = EditorClient(answers=[WAIT])
    with ScriptedServer([Reply("", [EDIT]), Reply("Next.")]) as server:
        async with resident_acp(client, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            turn = asyncio.create_task(prompt(agent.conn, session.session_id, "fix add"))
            await asyncio.wait_for(client.asked.wait(), TIMEOUT)
            await agent.conn.cancel(session_id=session.session_id)
            response = await turn
            again = await prompt(agent.conn, session.session_id, "go on")
    assert response.stop_reason == "cancelled", stderr_of(repo)
    assert (repo / "calc.py").read_text() == CALC
    assert again.stop_reason == "end_turn"
    told = [m for m in server.requests[1]["messages"] if m["role"] == "tool"][-1]
    assert "cancelled" in told["content"]


async def test_a_session_loads_in_a_new_process_with_its_history_replayed(repo):
    first = EditorClient()
    script = [
        Reply("", [call("read", path="README.md")], reasoning="Look first."),
        Reply("It adds and multiplies."),
        Reply("Yes, that one."),
    ]
    with ScriptedServer(script) as server:
        async with resident_acp(first, server.url, repo) as agent:
            session = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
            await prompt(agent.conn, session.session_id, "what is this?")
        second = EditorClient()
        async with resident_acp(second, server.url, repo) as agent:
            listed = await agent.conn.list_sessions(cwd=str(repo))
            assert session.session_id in [s.session_id for s in listed.sessions]
            loaded = await asyncio.wait_for(
                agent.conn.load_session(
                    cwd=str(repo), session_id=session.session_id, mcp_servers=[]
                ),
                TIMEOUT,
            )
            replayed = list(second.updates)
            response = await prompt(agent.conn, session.session_id, "the calculator?")
    assert loaded.modes.current_mode_id == "ask", stderr_of(repo)
    kinds = [type(u).__name__ for u in replayed]
    assert kinds[:4] == [
        "UserMessageChunk",
        "AgentThoughtChunk",
        "ToolCallStart",
        "ToolCallProgress",
    ]
    assert second.user_text() == "what is this?"
    assert second.thoughts() == "Look first."
    (start,) = second.tool_starts()
    assert start.title == "Read README.md"
    assert second.tool_updates()[-1].status == "completed"
    assert "It adds and multiplies." in second.text()
    assert response.stop_reason == "end_turn"
    # The model sees the whole conversation, not just the new prompt.
    assert user_contents(server.requests[2])[-2:] == ["what is this?", "the calculator?"]


async def test_bad_requests_get_errors_and_the_server_goes_on(repo):
    client = EditorClient()
    refused = Status(400, '{"error": {"message": "the model is on strike"}}')
    with ScriptedServer([refused, Reply("Fine.")]) as server:
        async with resident_acp(client, server.url, repo) as agent:
            conn = agent.conn
            with pytest.raises(RequestError) as unknown:
                await prompt(conn, "no-such-session", "hello")
            assert unknown.value.code == -32602
            with pytest.raises(RequestError):
                await conn.new_session(cwd="relative/path", mcp_servers=[])
            with pytest.raises(RequestError) as missing:
                await conn.load_session(cwd=str(repo), session_id="20990101-000000-abcdef")
            assert "no session" in str(missing.value.data)
            session = await conn.new_session(cwd=str(repo), mcp_servers=[])
            with pytest.raises(RequestError) as image:
                await conn.prompt(
                    session_id=session.session_id, prompt=[image_block("AAAA", "image/png")]
                )
            assert "not supported" in str(image.value.data)
            with pytest.raises(RequestError):
                await conn.set_session_mode(session_id=session.session_id, mode_id="yolo")
            await conn.set_session_mode(session_id=session.session_id, mode_id="auto-edit")
            with pytest.raises(RequestError) as failed:  # the model failed: the turn broke
                await prompt(conn, session.session_id, "hello")
            assert "on strike" in str(failed.value)
            readme = (repo / "README.md").as_uri()
            mention = [text_block("what does "), resource_link_block("README.md", readme)]
            response = await asyncio.wait_for(
                conn.prompt(session_id=session.session_id, prompt=[*mention, text_block(" do?")]),
                TIMEOUT,
            )
        assert agent.process.returncode == 0, stderr_of(repo)
    assert response.stop_reason == "end_turn"
    assert user_contents(server.requests[1])[-1] == "what does `README.md` do?"


def _default_model_present() -> bool:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(cache) / "resident/models/smollm2-135m-instruct/config.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not _default_model_present(), reason="run `resident models pull` first")
async def test_two_sessions_share_the_local_engine(repo):
    """The local path: one engine loaded for both sessions. SmolLM2 cannot do much; the
    turns must still be well-formed. Few tools and tokens keep the CPU prefill short."""
    client = EditorClient()
    extra = ("--tools", "read", "--approval", "read-only", "--max-tokens", "8", "--max-turns", "2")
    async with resident_acp(client, None, repo, *extra) as agent:
        first = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        second = await agent.conn.new_session(cwd=str(repo), mcp_servers=[])
        answers = [
            await asyncio.wait_for(
                agent.conn.prompt(session_id=s.session_id, prompt=[text_block("What is calc.py?")]),
                120,
            )
            for s in (first, second)
        ]
    assert agent.process.returncode == 0, stderr_of(repo)
    assert first.session_id != second.session_id
    assert first.modes.current_mode_id == "read-only"
    # max_tokens when the 8 tokens ran out, max_turn_requests if it kept calling tools
    assert {a.stop_reason for a in answers} <= {"end_turn", "max_tokens", "max_turn_requests"}
    assert client.of(UsageUpdate) and client.of(UsageUpdate)[-1].size == 8192
