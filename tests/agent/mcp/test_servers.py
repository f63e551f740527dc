"""Real MCP servers (the SDK's, tests/agent/mcp/demo_server.py) over stdio and HTTP:
listing, calls, errors, a hang, a crash, a bad command, a slow start, the sandbox, stopping."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.core.mcp.connection import CallFailed
from agent.core.mcp.status import State
from agent.core.mcp.tool import McpTool
from tests.agent.mcp.helpers import (
    alive,
    copy_demo,
    demo_entry,
    free_port,
    manager_for,
    processes_naming,
    sandbox_for,
    start_http_server,
    stop_process,
)
from tools import ApprovalMode, PermissionPolicy, Registry, ToolContext, ToolResult, Verdict


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One stdio demo server for the module (it is slow to start): a 1 s call timeout."""
    workspace = Path(os.path.realpath(tmp_path_factory.mktemp("ws")))
    manager, _ = manager_for(workspace, {"demo": demo_entry(toolTimeout=1)})
    assert manager.wait_settled(30)
    yield manager, workspace
    manager.stop()


def test_tools_are_listed_namespaced_and_called(demo):
    manager, workspace = demo
    (status,) = manager.statuses()
    assert status.state is State.READY, status.reason
    names = [tool.name for tool in status.tools]
    assert names == sorted(names)
    assert {"mcp__demo__echo", "mcp__demo__add", "mcp__demo__read"} <= set(names)
    assert manager.version == 1

    def call(tool: str, **arguments) -> ToolResult:
        offered = next(t for t in status.tools if t.original == tool)
        registry = Registry([McpTool(offered, manager)])
        return registry.call(offered.name, arguments, ToolContext(workspace=workspace))

    assert call("echo", text="hello").output == "hello"
    assert call("add", a=2, b=40).output == "42"
    image = call("picture")
    assert image.ok and image.output == "[image: image/png, 12 KB]"
    assert image.data["non_text"] == ["image"]
    failed = call("fail", message="the disk is full")
    assert not failed.ok and "the disk is full" in failed.output
    bad = call("add", a="two", b=2)  # checked against the tool's schema before any call
    assert not bad.ok and "Invalid arguments for 'mcp__demo__add'" in bad.output
    assert "'two' is not of type 'integer'" in bad.output
    assert '"a": integer' in bad.output  # the expected shape, from the server's schema


def test_the_built_in_read_is_untouched_by_a_server_tool_of_that_name(demo, tmp_path):
    manager, workspace = demo
    offered = next(t for t in manager.statuses()[0].tools if t.original == "read")
    assert offered.name == "mcp__demo__read"
    from tools import default_registry

    registry = default_registry()
    registry.register(McpTool(offered, manager))
    (tmp_path / "f.txt").write_text("local file\n")
    ctx = ToolContext(workspace=tmp_path)
    assert "local file" in registry.call("read", {"path": "f.txt"}, ctx).output
    assert registry.call("mcp__demo__read", {"path": "f.txt"}, ctx).output == "demo read of f.txt"


def test_a_hanging_call_times_out_and_the_server_stays_up(demo):
    manager, _ = demo
    started = time.monotonic()
    with pytest.raises(CallFailed, match="did not answer within 1s"):
        manager.call("demo", "hang", {})
    assert time.monotonic() - started < 8
    assert manager.call("demo", "echo", {"text": "still here"}).content[0].text == "still here"


def test_an_interrupt_cancels_a_call(demo):
    manager, _ = demo
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(CallFailed, match="interrupted"):
        manager.call("demo", "hang", {}, cancel)
    assert time.monotonic() - started < 1.5


def test_calls_need_approval_by_default(demo):
    manager, workspace = demo
    offered = next(t for t in manager.statuses()[0].tools if t.original == "echo")
    call = Registry([McpTool(offered, manager)]).parse(offered.name, {"text": "x"})
    policy = PermissionPolicy(ApprovalMode.ASK, workspace=workspace)
    assert policy.check(call).verdict is Verdict.ASK


def test_a_crash_costs_that_server_only_and_stop_leaves_no_process(tmp_path):
    workspace = Path(os.path.realpath(tmp_path))
    manager, _ = manager_for(workspace, {"a": demo_entry(), "b": demo_entry(), "c": demo_entry()})
    try:
        assert manager.wait_settled(30)
        assert [s.state for s in manager.statuses()] == [State.READY] * 3
        with pytest.raises(CallFailed, match="MCP server 'a' failed: the server closed"):
            manager.call("a", "crash", {})
        assert manager.statuses()[0].state is State.FAILED
        with pytest.raises(CallFailed, match="MCP server 'a' failed"):
            manager.call("a", "echo", {"text": "x"})
        killed = manager.call("b", "pid", {}).structured_content["result"]
        os.kill(killed, signal.SIGKILL)  # dies while idle: noticed without a call
        deadline = time.monotonic() + 10
        while manager.statuses()[1].state is not State.FAILED:
            assert time.monotonic() < deadline, manager.statuses()[1]
            time.sleep(0.02)
        assert "closed the connection" in manager.statuses()[1].reason
        pid = manager.call("c", "pid", {}).structured_content["result"]
        assert alive(pid) and manager.statuses()[2].state is State.READY
    finally:
        manager.stop()
    assert not alive(pid)
    assert manager.statuses()[2].state is State.STOPPED


def test_a_bad_command_and_a_server_that_never_answers_fail_with_why(tmp_path):
    workspace = Path(os.path.realpath(tmp_path))
    marker = f"never-answers-{tmp_path.name}"
    silent = {
        "command": sys.executable,
        "args": ["-c", f"import sys; sys.stdin.read()  # {marker}"],
    }
    manager, _ = manager_for(
        workspace,
        {
            "bad": {"command": str(tmp_path / "no-such-server")},
            "mute": silent | {"startupTimeout": 0.5},
            "slow": silent | {"startupTimeout": 600},
        },
    )
    try:
        deadline = time.monotonic() + 20
        while [s.state for s in manager.statuses()][:2] != [State.FAILED, State.FAILED]:
            assert time.monotonic() < deadline, manager.statuses()
            time.sleep(0.02)
        bad, mute, slow = manager.statuses()
        assert "no-such-server" in bad.reason and "No such file or directory" in bad.reason
        assert mute.reason == "did not start within 0.5s"
        assert slow.state is State.STARTING and manager.version == 0
        with pytest.raises(CallFailed, match="MCP server 'bad' failed"):
            manager.call("bad", "echo", {})
        with pytest.raises(CallFailed, match="MCP server 'slow' is not ready"):
            manager.call("slow", "echo", {})
    finally:
        started = time.monotonic()
        manager.stop()  # a server still starting is stopped, not waited for
    assert time.monotonic() - started < 5
    assert manager.statuses()[2].state is State.STOPPED
    assert processes_naming(marker) == []


def test_streamable_http_server_with_headers_and_its_crash(tmp_path):
    port = free_port()
    process = start_http_server(port)
    try:
        entry = {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Test": "1"}}
        manager, _ = manager_for(Path(os.path.realpath(tmp_path)), {"web": entry})
        try:
            assert manager.wait_settled(30)
            (status,) = manager.statuses()
            assert status.state is State.READY, status.reason
            assert status.transport == "http" and "mcp__web__echo" in [t.name for t in status.tools]
            assert manager.call("web", "add", {"a": 1, "b": 2}).content[0].text == "3"
            stop_process(process)
            with pytest.raises(CallFailed, match="MCP server 'web'"):
                manager.call("web", "echo", {"text": "anyone?"})
            deadline = time.monotonic() + 10
            while manager.statuses()[0].state is not State.FAILED:
                assert time.monotonic() < deadline, manager.statuses()
                time.sleep(0.05)
        finally:
            manager.stop()
    finally:
        stop_process(process)


def test_a_stdio_server_runs_in_the_sandbox(tmp_path):
    workspace = Path(os.path.realpath(tmp_path / "ws"))
    workspace.mkdir()
    if sandbox_for(workspace) is None:
        pytest.skip("no sandbox on this machine")
    script = copy_demo(workspace)
    manager, _ = manager_for(workspace, {"boxed": demo_entry(script)}, sandboxed=True)
    try:
        assert manager.wait_settled(30)
        (status,) = manager.statuses()
        assert status.state is State.READY, status.reason
        assert status.sandbox == "bubblewrap: workspace read-only, network off"
        answer = manager.call("boxed", "touch", {"name": "planted.txt"}).content[0].text
        assert answer == "could not write: Read-only file system"
        assert not (workspace / "planted.txt").exists()
        assert manager.call("boxed", "pid", {}).structured_content["result"] < 10  # its own PIDs
        assert processes_naming(str(script))
    finally:
        manager.stop()
    assert processes_naming(str(script)) == []
