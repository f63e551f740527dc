"""A model's tool-call arguments of a hostile shape: a tool error the model reads, and on (issue 38).

Arguments nested 100,000 deep raised RecursionError out of the turn loop
(`history_arguments` caught only ValueError) and ended the task, for every
tool. Now every tool the agent offers answers such a call with a tool result
that says why, in every approval mode, the history keeps only valid JSON
arguments, and the model's next request goes out.
"""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from agent.acp.tool_calls import parse_arguments
from agent.core.events import ToolCallEvent
from agent.event_printers import ProgressPrinter
from agent.tui.format import arguments as tui_arguments
from tests.agent.helpers import run_cli
from tests.agent.scripted_server import Reply, ScriptedServer
from tests.agent.test_loop import assert_consistent, start
from tools import ApprovalMode, schema


def deep_arguments(depth: int) -> str:
    return '{"path": ' + "[" * depth + "]" * depth + "}"


async def _run(script_for, approval=ApprovalMode.ASK):
    """Run one task whose first answer is script_for(tool names); (outcome, events, requests)."""
    with ScriptedServer([]) as server:
        runtime, events = await start(server, approval=approval)
        names = runtime.agent.tools.registry.names()
        server.script[:] = [Reply("", script_for(names)), Reply("Understood.")]
        outcome = await runtime.agent.run_task("go")
        await runtime.close()
    return outcome, events, server.requests, names


@pytest.mark.parametrize("approval", list(ApprovalMode))
def test_every_tool_answers_deep_arguments_with_an_error_the_model_reads(repo, approval):
    # 2,000 levels is past json.loads' recursion limit, as 100,000 is, and quicker to stream.
    outcome, events, requests, names = asyncio.run(
        _run(lambda names: [(name, deep_arguments(2_000)) for name in names], approval)
    )
    assert outcome.reason == "done" and outcome.final_message == "Understood."
    results = [e for e in events if e.type == "tool_result"]
    assert len(results) == len(names) > 10
    for result in results:
        assert not result.ok and "nest deeper than 64 levels" in result.output, result.output
    history = requests[1]["messages"][1:]
    assert_consistent(history)
    sent = [c["function"]["arguments"] for m in history for c in m.get("tool_calls", [])]
    assert sent == ["{}"] * len(names)


def test_the_issues_100000_levels(repo):
    outcome, events, requests, _ = asyncio.run(
        _run(lambda names: [("read", deep_arguments(100_000))])
    )
    assert outcome.reason == "done"
    result = next(e for e in events if e.type == "tool_result")
    assert "were refused: they nest deeper than 64 levels" in result.output
    assert "The call was not run" in result.output
    assert requests[1]["messages"][-1]["role"] == "tool"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ('{"path": ' + "1" * 5_000 + "}", "not valid JSON"),  # past Python's digit limit
        ('{"path": "calc.py", "limit": NaN}', "NaN is not JSON"),
        ('{"path": "calc.py", "limit": 1e400}', "not a finite number"),
        ('{"path": "' + "x" * 20_000 + '"}', "more than the 10,000 a tool call may carry"),
    ],
    ids=["digits", "nan", "1e400", "size"],
)
def test_other_shapes_json_cannot_hold_are_tool_errors(repo, monkeypatch, raw, words):
    # A smaller cap than the real 4 MiB, which takes a while to stream 7 characters a time.
    monkeypatch.setattr(schema, "MAX_ARGUMENT_CHARS", 10_000)
    outcome, events, requests, _ = asyncio.run(_run(lambda names: [("read", raw)]))
    assert outcome.reason == "done"
    result = next(e for e in events if e.type == "tool_result")
    assert not result.ok and words in result.output, result.output[:300]
    assert requests[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_headless_progress_output_survives_deep_arguments(repo):
    script = [Reply("", [("read", deep_arguments(100_000))]), Reply("Understood.")]
    with ScriptedServer(script) as server:
        result = run_cli("go", "--attach", server.url)
    assert result.exit_code == 0 and result.stdout.strip() == "Understood."


def test_front_ends_read_deep_arguments_as_none():
    raw = deep_arguments(100_000)
    assert tui_arguments(raw) == {} and parse_arguments(raw) == {}
    assert json.loads(json.dumps(raw)) == raw  # the JSON event printer writes it as a string

    out = io.StringIO()
    ProgressPrinter(out)(ToolCallEvent(id="c", name="read", arguments=raw))
    assert "read" in out.getvalue() and len(out.getvalue()) < 1_000
