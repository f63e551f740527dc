"""The `task` tool through the real loop and the scripted model server: children get the
parent's prefix byte for byte, run read-only unless allowed more, run side by side, nest
their events under the parent's call, and stop with the parent."""

from __future__ import annotations

import asyncio
import threading

from agent.core.events import Event, parse_event
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.session import SessionStore
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, call, wait_for
from tools import ApprovalMode

FIND = call("task", description="find add", prompt="Where is add defined? Give the line.")


async def start(server, approval=ApprovalMode.ASK, **options):
    events: list[Event] = []
    runtime = await open_runtime(
        RuntimeOptions(attach=server.url, approval=approval, **options), [events.append]
    )
    return runtime, events


def nested(events, call_id):
    return [e.event for e in events if e.type == "subagent" and e.id == call_id]


def test_a_child_starts_from_the_parents_prefix_and_reports_back(repo):
    script = [Reply("", [FIND]), Reply("add is in calc.py, line 4."), Reply("It is calc.py:4.")]
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url), "where is add?")
        parent_first, child_first, parent_second = server.requests
    assert result.exit_code == 0, result.stderr
    # The child's prompt is the parent's prefix (system message and tools) plus its task.
    assert child_first["messages"][0] == parent_first["messages"][0]
    assert child_first["tools"] == parent_first["tools"]
    assert len(child_first["messages"]) == 2
    assert "Where is add defined?" in child_first["messages"][1]["content"]
    assert "where is add?" not in child_first["messages"][1]["content"]  # not the parent's talk
    # The child's answer is the parent's tool result.
    tool_message = parent_second["messages"][-1]
    assert (
        tool_message["role"] == "tool" and tool_message["content"] == "add is in calc.py, line 4."
    )
    started = result.of_type("subagent_started")[0]
    assert started["description"] == "find add" and started["approval"] == "read-only"
    inner = [e["event"]["type"] for e in result.of_type("subagent")]
    assert inner[:2] == ["user_message", "turn_started"] and inner[-1] == "turn_completed"
    completed = result.of_type("subagent_completed")[0]
    assert completed["reason"] == "done" and completed["turns"] == 1
    assert completed["id"] == started["id"] == result.of_type("tool_call")[0]["id"]
    order = [t for t in result.types() if t.startswith(("tool_", "subagent_"))]
    assert order == ["tool_call", "subagent_started", "subagent_completed", "tool_result"]
    assert result.final["final_message"] == "It is calc.py:4."


def test_children_of_one_answer_run_at_the_same_time(repo):
    """The first child's answer stalls until the second child's request has arrived:
    run one after the other, they would never both be in flight."""
    other = call("task", description="find mul", prompt="Where is mul defined?")
    script = [Reply("", [FIND, other]), Reply("one", stall=True), Reply("two"), Reply("Both.")]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, events = await start(server)

            def release_when_both_asked():
                deadline = threading.Event()
                for _ in range(200):
                    if len(server.requests) >= 3:
                        break
                    deadline.wait(0.05)
                both = len(server.requests) >= 3
                server.release.set()
                return both

            releaser = asyncio.create_task(asyncio.to_thread(release_when_both_asked))
            outcome = await runtime.agent.run_task("find both")
            both = await releaser
            messages = list(runtime.agent.conversation.messages)
            await runtime.close()
            return outcome, both, messages

    outcome, both, messages = asyncio.run(scenario())
    assert both, "the second child's request never came while the first was in flight"
    assert outcome.final_message == "Both."
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert sorted(results) == ["one", "two"]
    calls = [c["id"] for c in messages[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == calls


def test_a_research_child_cannot_write_even_in_full_auto(repo):
    child_write = call("write", path="new.txt", content="x")
    script = [Reply("", [FIND]), Reply("", [child_write]), Reply("I may not write."), Reply("ok")]
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url, "--approval", "full-auto"), "do it")
    assert result.exit_code == 0
    assert not (repo / "new.txt").exists()
    inner = [e["event"] for e in result.of_type("subagent")]
    denied = [e for e in inner if e["type"] == "tool_result"]
    assert denied and not denied[0]["ok"] and "Denied" in denied[0]["output"]


def test_a_writing_child_needs_what_an_edit_needs(repo):
    task = call("task", description="add a file", prompt="Create new.txt.", write=True)
    child_write = call("write", path="new.txt", content="made by a child\n")
    # ask mode, nobody to ask: the task itself is the approval that cannot be given.
    with ScriptedServer([Reply("", [task])]) as server:
        asked = run_cli(*attached(server.url), "make a file")
    assert asked.exit_code == 3 and not (repo / "new.txt").exists()
    assert asked.of_type("approval_requested")[0]["name"] == "task"
    # auto-edit: the parent takes its checkpoint, the child writes in the parent's mode.
    script = [Reply("", [task]), Reply("", [child_write]), Reply("Created."), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url, "--approval", "auto-edit"), "make a file")
    assert result.exit_code == 0, result.stderr
    assert (repo / "new.txt").read_text() == "made by a child\n"
    assert result.of_type("subagent_started")[0]["approval"] == "auto-edit"
    assert result.types().index("checkpoint") < result.types().index("subagent_started")


def test_children_cannot_start_children(repo):
    script = [Reply("", [FIND]), Reply("", [FIND]), Reply("Alone then."), Reply("ok")]
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url), "go")
        child_tools = {t["function"]["name"] for t in server.requests[1]["tools"]}
    assert "task" in child_tools  # the same schemas: the prefix stays the parent's
    inner = [e["event"] for e in result.of_type("subagent")]
    refused = [e for e in inner if e["type"] == "tool_result"][0]
    assert not refused["ok"] and "cannot start subagents" in refused["output"]


def test_interrupting_the_parent_stops_its_child(repo):
    script = [Reply("", [FIND]), Reply("looking", stall=True), Reply("Next.")]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, events = await start(server)
            task = asyncio.create_task(runtime.agent.run_task("find"))
            await asyncio.to_thread(wait_for, server.stalled)
            runtime.agent.interrupt()
            outcome = await asyncio.wait_for(task, 10)
            await asyncio.to_thread(wait_for, server.aborted)  # the child's request dropped
            messages = list(runtime.agent.conversation.messages)
            await runtime.close()
            return outcome, events, messages

    outcome, events, messages = asyncio.run(scenario())
    assert outcome.reason == "interrupted"
    completed = [e for e in events if e.type == "subagent_completed"]
    assert completed and completed[0].reason == "interrupted"
    assert messages[-1]["role"] == "tool" and "interrupted" in messages[-1]["content"]


def test_the_journal_keeps_the_nested_events(repo):
    script = [Reply("", [FIND]), Reply("calc.py:4"), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url), "where is add?")
    session = SessionStore().open(result.of_type("session_started")[0]["session_id"])
    journal = session.load_events()
    nested_events = [e for e in journal if e.type == "subagent"]
    assert nested_events and all(parse_event(e.event).type for e in nested_events)
    assert [e.type for e in journal if e.type.startswith("subagent_")] == [
        "subagent_started",
        "subagent_completed",
    ]


def test_progress_shows_the_child_under_its_call(repo):
    script = [Reply("", [FIND]), Reply("", [call("read", path="calc.py")]), Reply("line 4")]
    script.append(Reply("Found it."))
    with ScriptedServer(script) as server:
        result = run_cli("--attach", server.url, "where is add?")
    assert result.exit_code == 0
    lines = result.stderr.splitlines()
    start = lines.index("  ┌ subagent: find add (read-only)")
    assert lines[start + 1].startswith("  │ → read(path=")
    assert lines[start + 2].startswith("  │   ✓ ")
    assert lines[start + 3] == "  └ subagent done (2 turns): line 4"
    assert result.stdout.strip() == "Found it."


def test_a_guard_hook_holds_for_a_childs_calls(repo):
    from tests.agent.hooks.helpers import user_hooks

    user_hooks({"pre_tool": [{"matcher": "^read$", "command": "echo 'no reads' >&2; exit 2"}]})
    script = [Reply("", [FIND]), Reply("", [call("read", path="calc.py")]), Reply("blocked")]
    script.append(Reply("ok"))
    with ScriptedServer(script) as server:
        result = run_cli(*attached(server.url), "go")
        child_second = server.requests[2]
    assert result.exit_code == 0
    told = child_second["messages"][-1]
    assert told["role"] == "tool" and "no reads" in told["content"]
    inner = [e["event"] for e in result.of_type("subagent")]
    assert [e["outcome"] for e in inner if e["type"] == "hook"] == ["blocked"]


def test_a_childs_approvals_name_its_task_call(repo):
    from agent.core.tool_runner import ApprovalAnswer

    task = call("task", description="add a file", prompt="Create new.txt.", write=True)
    child_write = call("write", path="new.txt", content="x\n")
    script = [Reply("", [task]), Reply("", [child_write]), Reply("Created."), Reply("Done.")]
    asked = []

    async def approve(request):
        asked.append(request)
        return ApprovalAnswer(True)

    async def scenario():
        with ScriptedServer(script) as server:
            events: list[Event] = []
            runtime = await open_runtime(
                RuntimeOptions(attach=server.url, approval=ApprovalMode.ASK),
                [events.append],
                approve,
            )
            outcome = await runtime.agent.run_task("make a file")
            await runtime.close()
            return outcome

    outcome = asyncio.run(scenario())
    assert outcome.reason == "done" and (repo / "new.txt").read_text() == "x\n"
    assert [(r.tool, r.parent_id) for r in asked] == [("task", ""), ("write", asked[0].call_id)]
