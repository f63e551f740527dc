"""The todo list through the real loop and the scripted model server: events, journal,
resume, and how headless runs show it."""

from __future__ import annotations

import asyncio

from agent.core.events import Event, TodoUpdated
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.todo import TODO_TOOL
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tools import ApprovalMode

FIRST = [
    {"content": "Read calc.py", "status": "in_progress"},
    {"content": "Fix add", "status": "pending"},
]
SECOND = [
    {"content": "Read calc.py", "status": "done"},
    {"content": "Fix add", "status": "in_progress"},
]


def todo_call(todos: list[dict[str, str]]):
    return call(TODO_TOOL, todos=todos)


def dumped(event: Event) -> list[dict[str, str]]:
    assert isinstance(event, TodoUpdated)
    return [item.model_dump() for item in event.items]


async def open_session(server: ScriptedServer, events: list[Event], **options):
    return await open_runtime(RuntimeOptions(attach=server.url, **options), [events.append])


def test_the_model_keeps_a_list_that_is_journaled_and_resumed(repo):
    script = [
        Reply("", [todo_call(FIRST)]),
        Reply("", [todo_call(SECOND)]),
        Reply("Working on it."),
        Reply("", [todo_call(SECOND)]),  # after the resume: the very list it already has
        Reply("Still on it."),
    ]

    async def scenario():
        events: list[Event] = []
        with ScriptedServer(script) as server:
            # Read-only mode: writing the list touches nothing, so nothing asks or refuses.
            runtime = await open_session(server, events, approval=ApprovalMode.READ_ONLY)
            outcome = await runtime.agent.run_task("fix add, step by step")
            session_id = runtime.session.id
            journal = runtime.session.load_events()
            messages = list(runtime.agent.conversation.messages)
            await runtime.close()
            resumed_events: list[Event] = []
            resumed = await open_session(server, resumed_events, resume=session_id)
            restored = [item.model_dump() for item in resumed.todos.items]
            again = await resumed.agent.run_task("go on")
            await resumed.close()
            fresh = await open_session(server, [])
            fresh_items = fresh.todos.items
            await fresh.close()
        return outcome, events, journal, messages, restored, again, resumed_events, fresh_items

    outcome, events, journal, messages, restored, again, resumed_events, fresh = asyncio.run(
        scenario()
    )
    assert outcome.reason == "done" and again.reason == "done"
    tool_events = [e.type for e in events if e.type.startswith(("tool", "todo", "approval"))]
    assert tool_events == ["tool_call", "todo_updated", "tool_result"] * 2
    assert "checkpoint" not in [e.type for e in events]  # it changes no file
    updates = [e for e in events if isinstance(e, TodoUpdated)]
    assert [dumped(e) for e in updates] == [FIRST, SECOND]
    # Journaled like every event, with the same sequence numbers.
    journaled = [e for e in journal if isinstance(e, TodoUpdated)]
    assert [(e.seq, dumped(e)) for e in journaled] == [(e.seq, dumped(e)) for e in updates]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert results[1].startswith("Todo list saved (1/2 done):\n[done] Read calc.py")
    # --resume starts from the last list; rewriting it unchanged is no event.
    assert restored == SECOND
    assert not [e for e in resumed_events if isinstance(e, TodoUpdated)]
    resumed_results = [e for e in resumed_events if e.type == "tool_result"]
    assert resumed_results[0].output.startswith("Todo list unchanged (1/2 done)")
    # A new session starts with none.
    assert fresh == []


def test_a_list_with_two_items_in_progress_is_refused_and_the_model_told(repo):
    both = [{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}]
    script = [Reply("", [todo_call(both)]), Reply("Sorry.")]

    async def scenario():
        events: list[Event] = []
        with ScriptedServer(script) as server:
            runtime = await open_session(server, events)
            await runtime.agent.run_task("plan it")
            await runtime.close()
        return events, server.requests

    events, requests = asyncio.run(scenario())
    assert not [e for e in events if isinstance(e, TodoUpdated)]
    (result,) = [e for e in events if e.type == "tool_result"]
    assert not result.ok and "2 items are in_progress" in result.output
    assert "2 items are in_progress" in requests[1]["messages"][-1]["content"]


def test_the_tool_is_offered_to_the_model(repo):
    with ScriptedServer([Reply("Hi."), Reply("Hi.")]) as server:
        run_cli("hi", *attached(server.url))
        limited = run_cli("hi", *attached(server.url, "--tools", f"read,{TODO_TOOL}"))
    offered = [t["function"]["name"] for t in server.requests[0]["tools"]]
    assert TODO_TOOL in offered
    assert limited.exit_code == 0, limited.stderr
    assert [t["function"]["name"] for t in server.requests[1]["tools"]] == ["read", TODO_TOOL]
    assert "todo_write" in server.requests[0]["messages"][0]["content"]  # the system prompt


def test_headless_json_streams_the_updates(repo):
    script = [Reply("", [todo_call(FIRST)]), Reply("", [todo_call(SECOND)]), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli("fix add", *attached(server.url))
    assert result.exit_code == 0, result.stderr
    updates = result.of_type("todo_updated")
    assert [u["items"] for u in updates] == [FIRST, SECOND]
    types = result.types()
    first_call = types.index("tool_call")
    assert types[first_call : first_call + 3] == ["tool_call", "todo_updated", "tool_result"]


def test_the_progress_printer_shows_the_list_when_it_changes(repo):
    script = [Reply("", [todo_call(FIRST)]), Reply("", [todo_call(FIRST)]), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = run_cli("fix add", "--attach", server.url)
    assert result.exit_code == 0, result.stderr
    assert "[todo 0/2 done]\n  ◐ Read calc.py\n  ☐ Fix add\n" in result.stderr
    assert result.stderr.count("[todo ") == 1  # the unchanged second list prints nothing
    assert result.stderr.count(f"→ {TODO_TOOL}\n") == 2  # each call one short line
    assert "Todo list saved" not in result.stderr  # the result repeats what the list shows


def test_a_compaction_keeps_the_list_for_the_model(repo):
    script = [Reply("", [todo_call(SECOND)]), Reply("On it."), Reply("We fixed half of add.")]

    async def scenario():
        events: list[Event] = []
        with ScriptedServer(script) as server:
            runtime = await open_session(server, events, approval=ApprovalMode.READ_ONLY)
            await runtime.agent.run_task("fix add, step by step")
            compacted = await runtime.agent.compact()
            messages = list(runtime.agent.conversation.messages)
            await runtime.close()
        return compacted, messages

    compacted, messages = asyncio.run(scenario())
    assert compacted and len(messages) == 1
    content = messages[0]["content"]
    assert "We fixed half of add." in content
    assert content.endswith("1/2 done:\n[done] Read calc.py\n[in_progress] Fix add")


def test_undo_takes_the_list_back_with_the_files(repo):
    edit = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
    script = [
        Reply("", [todo_call(FIRST)]),
        Reply("Planned."),
        Reply("", [todo_call(SECOND), edit]),
        Reply("Fixed."),
    ]

    async def scenario():
        events: list[Event] = []
        with ScriptedServer(script) as server:
            runtime = await open_session(server, events, approval=ApprovalMode.AUTO_EDIT)
            await runtime.agent.run_task("plan it")  # writes the list, changes no file
            await runtime.agent.run_task("now fix add")  # updates the list and edits
            report = await runtime.agent.undo()
            after = [item.model_dump() for item in runtime.todos.items]
            await runtime.close()
        return report, after, events

    report, after, events = asyncio.run(scenario())
    assert "calc.py" in report.written and "return a - b" in (repo / "calc.py").read_text()
    assert after == FIRST  # the list as the undone task found it
    assert dumped([e for e in events if e.type == "todo_updated"][-1]) == FIRST
