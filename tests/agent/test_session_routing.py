"""Attached, the agent names its repository in the headers routers keep requests on one
replica by, for every session's requests and its subagents' alike, and again when
resumed (agent/core/clients/http.py, SESSION_HEADERS and repository_key)."""

from __future__ import annotations

import asyncio
import json

import httpx

from agent.core.clients import ChatRequest, HTTPClient
from agent.core.clients.http import SESSION_HEADERS, repository_key
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, call

FIND = call("task", description="find add", prompt="Where is add defined? Give the line.")


def session_keys(headers: dict[str, str]) -> list[str | None]:
    return [headers.get(name.lower()) for name in SESSION_HEADERS]


def test_every_request_on_a_repository_and_its_subagents_carries_its_key(repo, tmp_path):
    script = [Reply("", [FIND]), Reply("add is in calc.py, line 4."), Reply("It is calc.py:4.")]
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url), "where is add?")
        sent = list(server.request_headers)
    assert result.exit_code == 0, result.stderr
    session_id = result.of_type("session_started")[0]["session_id"]
    key = repository_key(repo)
    assert key.startswith("repo-") and key != repository_key(tmp_path)
    assert len(sent) == 3  # parent, child, parent
    assert [session_keys(h) for h in sent] == [[key, key]] * 3

    with ScriptedServer([Reply("Still calc.py:4.")]) as server:
        resumed = run_cli(*attached(server.url), "--resume", session_id, "and mul?")
        again = list(server.request_headers)
    assert resumed.exit_code == 0, resumed.stderr
    assert [session_keys(h) for h in again] == [[key, key]]

    with ScriptedServer([Reply("calc.py:4 again.")]) as server:  # another session, same repo
        other = run_cli(*attached(server.url), "where is add, again?")
        sent = list(server.request_headers)
    assert other.exit_code == 0, other.stderr
    assert other.of_type("session_started")[0]["session_id"] != session_id
    assert [session_keys(h) for h in sent] == [[key, key]]


def test_an_unbound_client_sends_no_session_headers():
    seen: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def one(client: HTTPClient) -> None:
        request = ChatRequest([{"role": "user", "content": "hi"}])
        async for _ in client.stream(request):
            pass

    client = HTTPClient("http://test", model="m", transport=httpx.MockTransport(handler))
    asyncio.run(one(client))
    assert session_keys(dict(seen[0])) == [None, None]
    client.bind_session("20250101-000000-abcdef")
    asyncio.run(one(client))
    assert session_keys(dict(seen[1])) == ["20250101-000000-abcdef"] * 2
