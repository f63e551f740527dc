"""The turn loop driven directly: approvals, bad tool calls, interrupts, broken streams."""

from __future__ import annotations

import asyncio
import json

import pytest

from agent.core.events import Event
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest
from tests.agent.scripted_server import (
    CutMidToolCall,
    Garbage,
    Reply,
    ScriptedServer,
    call,
    wait_for,
    wait_until,
)
from tools import ApprovalMode

EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")


async def start(server, approval=ApprovalMode.ASK, approve=None, **options):
    events: list[Event] = []
    runtime = await open_runtime(
        RuntimeOptions(attach=server.url, approval=approval, **options),
        [events.append],
        approve,
    )
    return runtime, events


def types(events):
    return [e.type for e in events]


def shown(events) -> str:
    return "".join(e.text for e in list(events) if e.type == "text_delta")


def assert_consistent(messages):
    """Every assistant tool call is answered by a tool message, in order."""
    expected: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert expected and message["tool_call_id"] == expected.pop(0)
        else:
            assert not expected, f"calls without results: {expected}"
            expected = [c["id"] for c in message.get("tool_calls", [])]
    assert not expected


def test_approved_by_the_user(repo):
    asked: list[ApprovalRequest] = []

    async def approve(request):
        asked.append(request)
        return ApprovalAnswer(True)

    async def scenario():
        with ScriptedServer([Reply("", [EDIT]), Reply("Done.")]) as server:
            runtime, events = await start(server, approve=approve)
            outcome = await runtime.agent.run_task("fix add")
            await runtime.close()
        return outcome, events

    outcome, events = asyncio.run(scenario())
    assert outcome.reason == "done"
    assert asked[0].tool == "edit" and asked[0].arguments["path"] == "calc.py"
    assert "return a + b" in (repo / "calc.py").read_text()
    order = [t for t in types(events) if t.startswith(("tool", "approval", "checkpoint"))]
    assert order == [
        "tool_call",
        "approval_requested",
        "approval_resolved",
        "checkpoint",
        "tool_result",
    ]


def test_denied_by_the_user_tells_the_model(repo):
    async def approve(request):
        return ApprovalAnswer(False, "use a smaller change")

    async def scenario():
        with ScriptedServer([Reply("", [EDIT]), Reply("Understood.")]) as server:
            runtime, events = await start(server, approve=approve)
            outcome = await runtime.agent.run_task("fix add")
            await runtime.close()
            return outcome, events, server.requests

    outcome, events, requests = asyncio.run(scenario())
    assert outcome.reason == "done"
    assert "return a - b" in (repo / "calc.py").read_text()
    told = requests[1]["messages"][-1]
    assert told["role"] == "tool" and "denied" in told["content"]
    assert "use a smaller change" in told["content"]
    assert "checkpoint" not in types(events)


@pytest.mark.parametrize(
    ("tool_call", "expected"),
    [
        (("read", '{"path": "calc.py"'), "not valid JSON"),
        (("frobnicate", {"x": 1}), "Unknown tool 'frobnicate'"),
        (("read", {"path": 3, "bogus": True}), "Invalid arguments"),
    ],
)
def test_malformed_tool_call_becomes_a_tool_error(repo, tool_call, expected):
    async def scenario():
        with ScriptedServer([Reply("", [tool_call]), Reply("Sorry.")]) as server:
            runtime, events = await start(server)
            outcome = await runtime.agent.run_task("read calc")
            await runtime.close()
            return outcome, events, server.requests

    outcome, events, requests = asyncio.run(scenario())
    assert outcome.reason == "done"
    result = next(e for e in events if e.type == "tool_result")
    assert not result.ok and expected in result.output
    history = requests[1]["messages"][1:]
    assert_consistent(history)
    for message in history:  # the next request carries only valid JSON arguments
        for sent in message.get("tool_calls", []):
            assert isinstance(json.loads(sent["function"]["arguments"]), dict)


def test_several_calls_in_one_turn(repo):
    script = [
        Reply("", [call("read", path="calc.py"), call("read", path="README.md")]),
        Reply("ok"),
    ]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, events = await start(server)
            await runtime.agent.run_task("read both")
            await runtime.close()
            return events, server.requests

    events, requests = asyncio.run(scenario())
    results = [e for e in events if e.type == "tool_result"]
    assert [r.ok for r in results] == [True, True]
    assert "Adds and multiplies" in results[1].output
    assert_consistent(requests[1]["messages"][1:])


def test_interrupt_during_generation(repo):
    async def scenario():
        with ScriptedServer([Reply("I am thinking about", stall=True), Reply("Next.")]) as server:
            runtime, events = await start(server)
            task = asyncio.create_task(runtime.agent.run_task("slow"))
            await asyncio.to_thread(wait_for, server.stalled)
            # The server has sent the text; interrupt once the client has it all too.
            await asyncio.to_thread(wait_until, lambda: shown(events) == "I am thinking about")
            runtime.agent.interrupt()
            outcome = await asyncio.wait_for(task, 10)
            await asyncio.to_thread(wait_for, server.aborted)  # the request was dropped
            after = await runtime.agent.run_task("again")
            await runtime.close()
            return outcome, after, events, server.requests

    outcome, after, events, requests = asyncio.run(scenario())
    assert outcome.reason == "interrupted"
    assert after.reason == "done" and after.final_message == "Next."
    completed = [e.finish_reason for e in events if e.type == "turn_completed"]
    assert completed == ["interrupted", "stop"]
    history = requests[1]["messages"][1:]
    assert history[1]["content"].startswith("I am thinking about")
    assert history[1]["content"].endswith("[interrupted by the user]")
    assert history[2] == {"role": "user", "content": "again"}


def test_interrupt_kills_a_running_command(repo):
    script = [Reply("", [call("shell", command="sleep 30"), call("read", path="calc.py")])]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, events = await start(server, approval=ApprovalMode.FULL_AUTO)
            task = asyncio.create_task(runtime.agent.run_task("run it"))
            while not any(e.type == "tool_call" for e in events):
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # the shell is running
            runtime.agent.interrupt()
            outcome = await asyncio.wait_for(task, 15)
            messages = list(runtime.agent.conversation.messages)
            await runtime.close()
            return outcome, events, messages

    outcome, events, messages = asyncio.run(scenario())
    assert outcome.reason == "interrupted"
    results = [e for e in events if e.type == "tool_result"]
    assert len(results) == 2 and "Not run" in results[1].output
    assert_consistent(messages)


def test_stream_cut_mid_tool_call_leaves_history_clean(repo):
    async def scenario():
        with ScriptedServer([CutMidToolCall()]) as server:
            runtime, events = await start(server)
            outcome = await runtime.agent.run_task("read")
            messages = list(runtime.agent.conversation.messages)
            await runtime.close()
            return outcome, events, messages

    outcome, events, messages = asyncio.run(scenario())
    assert (outcome.reason, outcome.error_kind) == ("failed", "transient")
    assert "middle of a tool call" in outcome.final_message
    assert messages == [{"role": "user", "content": "read"}]
    assert "tool_call" not in types(events)


def test_garbage_from_the_server_fails_cleanly(repo):
    async def scenario():
        with ScriptedServer([Garbage()]) as server:
            runtime, events = await start(server)
            outcome = await runtime.agent.run_task("hi")
            await runtime.close()
            return outcome, events

    outcome, events = asyncio.run(scenario())
    assert outcome.reason == "failed"
    assert "not JSON" in outcome.final_message
    assert events[-2].type == "error" and events[-1].type == "turn_completed"


def test_native_markup_that_fails_to_parse_is_reported_to_the_model(repo):
    """A ToolCallError (local parsers) with no call: the model hears why, the loop goes on."""
    from agent.core.clients import Completion, ToolCallError

    async def scenario():
        with ScriptedServer([Reply("ok")]) as server:
            runtime, events = await start(server)
            real_stream = runtime.client.stream
            calls = 0

            async def stream(request):
                nonlocal calls
                calls += 1
                if calls == 1:
                    yield ToolCallError("hermes: arguments are not JSON")
                    yield Completion("stop")
                    return
                async for item in real_stream(request):
                    yield item

            runtime.client.stream = stream
            outcome = await runtime.agent.run_task("hi")
            await runtime.close()
            return outcome, server.requests

    outcome, requests = asyncio.run(scenario())
    assert outcome.reason == "done"
    note = requests[0]["messages"][-1]
    assert note["role"] == "user" and "could not be understood" in note["content"]


def test_undo_restores_files_and_conversation(repo):
    async def scenario():
        with ScriptedServer([Reply("", [EDIT]), Reply("Fixed.")]) as server:
            runtime, events = await start(server, approval=ApprovalMode.AUTO_EDIT)
            await runtime.agent.run_task("first")
            before = list(runtime.agent.conversation.messages)
            report = await runtime.agent.undo()
            after = list(runtime.agent.conversation.messages)
            nothing = await runtime.agent.undo()
            await runtime.close()
            return report, before, after, nothing

    report, before, after, nothing = asyncio.run(scenario())
    assert "calc.py" in report.written
    assert "return a - b" in (repo / "calc.py").read_text()
    assert len(before) == 4 and after == []  # back to before the task's question
    assert nothing is None
