"""The agent with MCP servers, end to end: a scripted model calls the demo server's tools through
the loop, with approvals, a crash, a bad server and a broken config; `resident run` and
`resident mcp list` from the command line."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from agent.cli import app
from agent.core.events import Event
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest
from tests.agent.helpers import attached, run_cli
from tests.agent.mcp.helpers import demo_entry, processes_naming, write_user_config
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tools import ApprovalMode


def tool_names(request: dict) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def tool_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def test_the_model_calls_mcp_tools_with_approval_and_survives_a_crash(repo, tmp_path):
    write_user_config(
        {"demo": demo_entry(), "broken": {"command": str(tmp_path / "missing-server")}}
    )
    asked: list[ApprovalRequest] = []

    async def approve(request):
        asked.append(request)
        return ApprovalAnswer(request.tool != "mcp__demo__add", "not that one")

    script = [
        Reply("", [call("mcp__demo__echo", text="hello"), call("mcp__demo__add", a=2, b=3)]),
        Reply("", [call("mcp__demo__crash")]),
        Reply("", [call("mcp__demo__echo", text="again")]),
        Reply("Done."),
    ]

    async def scenario():
        events: list[Event] = []
        with ScriptedServer(script) as server:
            runtime = await open_runtime(
                RuntimeOptions(attach=server.url, approval=ApprovalMode.ASK),
                [events.append],
                approve,
            )
            outcome = await runtime.agent.run_task("use the demo server")
            report = runtime.mcp.statuses()
            await runtime.close()
            return outcome, events, server.requests, report

    outcome, events, requests, report = asyncio.run(scenario())
    assert outcome.reason == "done" and outcome.final_message == "Done."
    names = tool_names(requests[0])
    assert names == sorted(names)  # built-ins and MCP tools, by name: a stable prefix
    assert {"read", "shell", "mcp__demo__echo", "mcp__demo__read"} <= set(names)
    assert not any(n.startswith("mcp__broken") for n in names)
    assert all(tool_names(r) == names for r in requests)  # fixed for the epoch, crash or not
    echo = next(t for t in requests[0]["tools"] if t["function"]["name"] == "mcp__demo__echo")
    assert echo["function"]["parameters"]["properties"] == {"text": {"type": "string"}}

    assert [a.tool for a in asked] == [
        "mcp__demo__echo",
        "mcp__demo__add",
        "mcp__demo__crash",
        "mcp__demo__echo",
    ]
    assert asked[0].request == 'MCP server demo: echo {"text": "hello"}'
    assert "asks before calling an MCP server's tool" in asked[0].reason
    first, denied = tool_messages(requests[1])
    assert first == "hello"
    assert "The user denied this call" in denied and "not that one" in denied
    crashed = tool_messages(requests[2])[-1]
    assert "MCP server 'demo' failed: the server closed the connection" in crashed
    after = tool_messages(requests[3])[-1]
    assert after.startswith("MCP server 'demo' failed")

    mcp_events = [(e.server, e.state) for e in events if e.type == "mcp_server"]
    assert ("broken", "failed") in mcp_events
    assert mcp_events.index(("demo", "starting")) < mcp_events.index(("demo", "ready"))
    assert ("demo", "failed") in mcp_events
    ready = next(e for e in events if e.type == "mcp_server" and e.state == "ready")
    assert "mcp__demo__echo" in ready.tools
    broken = next(e for e in events if e.type == "mcp_server" and e.state == "failed")
    assert broken.server == "broken"
    assert "missing-server" in broken.reason
    types = [e.type for e in events]
    assert types.index("session_started") < types.index("mcp_server")
    assert [s.state.value for s in report] == ["failed", "failed"]
    assert processes_naming("demo_server.py") == []


def test_headless_run_with_a_server_rule_and_a_broken_entry(repo):
    write_user_config({"demo": demo_entry(), "typo": {"comand": "x"}})
    script = [Reply("", [call("mcp__demo__add", a=20, b=22)]), Reply("42.")]
    with ScriptedServer(script) as server:
        result = run_cli("add them", *attached(server.url, "--allow", "mcp__demo"))
        assert result.exit_code == 0, result.stderr
        assert tool_messages(server.requests[1]) == ["42"]
    assert not result.of_type("approval_requested")  # the rule names the server
    typo = [e for e in result.of_type("mcp_server") if e["server"] == "typo"]
    assert typo[0]["state"] == "failed"
    assert "mcp.json: mcpServers.typo.comand: unknown field" in typo[0]["reason"]
    ready = [e for e in result.of_type("mcp_server") if e["state"] == "ready"]
    assert ready[0]["server"] == "demo" and "mcp__demo__add" in ready[0]["tools"]


def test_read_only_mode_does_not_call_mcp_tools(repo):
    write_user_config({"demo": demo_entry()})
    script = [Reply("", [call("mcp__demo__echo", text="x")]), Reply("ok")]
    with ScriptedServer(script) as server:
        result = run_cli("echo", *attached(server.url, "--approval", "read-only"))
        assert result.exit_code == 0, result.stderr
        (told,) = tool_messages(server.requests[1])
    assert "read-only mode does not call MCP tools" in told


def test_mcp_list_shows_servers_state_and_tools(repo):
    write_user_config({"demo": demo_entry(), "typo": {"url": "ftp://x"}})
    result = CliRunner().invoke(app, ["mcp", "list", "--json"], catch_exceptions=False)
    assert result.exit_code == 1  # a config problem
    report = json.loads(result.stdout)
    (demo,) = report["servers"]
    assert (demo["name"], demo["transport"], demo["state"], demo["source"]) == (
        "demo",
        "stdio",
        "ready",
        "user",
    )
    assert {
        "name": "mcp__demo__echo",
        "server_name": "echo",
        "description": "Echo the text back.",
    } in demo["tools"]
    (problem,) = report["problems"]
    assert problem["server"] == "typo" and "must start with http://" in problem["message"]
