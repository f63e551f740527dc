"""Plan mode through the loop, the scripted model server standing in for the model.

What the model receives (the instruction in the user's message, a prefix that
stays byte-identical across modes), what it may do (writes refused as tool
errors it reads), what its answer becomes (`plan_proposed`, a TaskOutcome
marked as a plan), and what proceeding does (the mode switched, the follow-up
task run under the new mode's approvals). Headless runs and the line REPL
are at the end.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

import prompts
from agent.cli import app
from agent.core.events import Event
from agent.core.plan_mode import (
    PLAN_CHOICES,
    PROCEED_MODES,
    proceed,
    proposes_plan,
    task_for_model,
)
from agent.core.runtime import RuntimeOptions, open_runtime
from agent.core.session import SessionStore
from tests.agent.helpers import attached, run_cli
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tools import ApprovalMode

PLAN = "1. Change `add` in calc.py to return a + b.\n2. Run the tests."
EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
WRITE = call("write", path="notes.txt", content="scratch")
INSTRUCTION = prompts.load("plan_mode").strip()
APPROVED = prompts.load("plan_approved").strip()


async def start(server, approval=ApprovalMode.PLAN, approve=None):
    events: list[Event] = []
    runtime = await open_runtime(
        RuntimeOptions(attach=server.url, approval=approval), [events.append], approve
    )
    return runtime, events


def user_messages(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


# -- the pieces ------------------------------------------------------------------------


def test_only_plan_mode_changes_the_users_message():
    assert task_for_model("fix add", ApprovalMode.PLAN) == f"fix add\n\n{INSTRUCTION}"
    for mode in ApprovalMode:
        if mode is not ApprovalMode.PLAN:
            assert task_for_model("fix add", mode) == "fix add"
    assert "numbered plan" in INSTRUCTION and "read-only" in INSTRUCTION


def test_an_answer_is_a_plan_only_when_the_task_ran_in_plan_mode_throughout():
    plan, ask = ApprovalMode.PLAN, ApprovalMode.ASK
    assert proposes_plan(plan, plan, "done", PLAN)
    assert not proposes_plan(plan, ask, "done", PLAN)  # switched during the task
    assert not proposes_plan(ask, plan, "done", PLAN)  # the model was never told
    assert not proposes_plan(plan, plan, "max_turns", PLAN)
    assert not proposes_plan(plan, plan, "done", "  \n")


def test_a_plan_is_carried_out_only_in_a_mode_that_can_change_things():
    assert PROCEED_MODES == (ApprovalMode.ASK, ApprovalMode.AUTO_EDIT, ApprovalMode.FULL_AUTO)
    assert [c.proceeds for c in PLAN_CHOICES] == [True, True, True, False]
    assert [c.label for c in PLAN_CHOICES] == ["Ask", "Auto-edit", "Full auto", "Keep planning"]

    class Holder:
        approval_mode = ApprovalMode.PLAN

    holder = Holder()
    for mode in (ApprovalMode.PLAN, ApprovalMode.READ_ONLY):
        with pytest.raises(ValueError, match="a plan is carried out in ask, auto-edit, full-auto"):
            proceed(holder, mode)
        assert holder.approval_mode is ApprovalMode.PLAN
    assert proceed(holder, ApprovalMode.FULL_AUTO) == APPROVED
    assert holder.approval_mode is ApprovalMode.FULL_AUTO
    assert APPROVED.startswith("The user approved the plan. Carry it out now")


# -- the loop --------------------------------------------------------------------------


def test_plan_mode_tells_the_model_refuses_writes_and_proposes_the_answer(repo):
    script = [Reply("Hi."), Reply("", [WRITE]), Reply(PLAN)]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, events = await start(server, approval=ApprovalMode.ASK)
            first = await runtime.agent.run_task("hello")
            runtime.agent.approval_mode = ApprovalMode.PLAN
            outcome = await runtime.agent.run_task("fix add")
            messages = list(runtime.agent.conversation.messages)
            session_id = runtime.session.id
            await runtime.close()
            return first, outcome, events, server.requests, messages, session_id

    first, outcome, events, requests, messages, session_id = asyncio.run(scenario())
    assert not first.plan
    # The instruction rides in the user's message; the prefix before it is untouched.
    assert user_messages(requests[1])[-1] == f"fix add\n\n{INSTRUCTION}"
    assert requests[1]["messages"][: len(requests[0]["messages"])] == requests[0]["messages"]
    assert requests[1]["tools"] == requests[0]["tools"]
    assert all(INSTRUCTION not in json.dumps(m) for m in requests[0]["messages"])
    # The write was refused as a tool error the model read; nothing was written.
    refused = requests[2]["messages"][-1]
    assert refused["role"] == "tool" and "plan mode does not allow changes" in refused["content"]
    assert not (repo / "notes.txt").exists()
    assert not [e for e in events if e.type in ("approval_requested", "checkpoint")]
    # The answer is the plan.
    assert (outcome.reason, outcome.plan, outcome.final_message) == ("done", True, PLAN)
    proposed = [e for e in events if e.type == "plan_proposed"]
    assert [e.text for e in proposed] == [PLAN]
    assert [e.type for e in events][-2:] == ["turn_completed", "plan_proposed"]
    # The conversation and the session on disk keep what the model saw.
    assert {"role": "user", "content": f"fix add\n\n{INSTRUCTION}"} in messages
    stored = SessionStore().open(session_id)
    assert stored.load_messages() == messages
    shown = [e.text for e in stored.load_events() if e.type == "user_message"]
    assert shown == ["hello", "fix add"]  # displays show what the user typed


def test_proceeding_switches_the_mode_and_carries_the_plan_out(repo):
    script = [Reply(PLAN), Reply("Fixing.", [EDIT]), Reply("Done: add adds.")]

    async def scenario():
        with ScriptedServer(script) as server:
            # No approval callback: anything that asked would stop the task.
            runtime, events = await start(server)
            planned = await runtime.agent.run_task("fix add")
            follow_up = proceed(runtime.agent, ApprovalMode.AUTO_EDIT)
            done = await runtime.agent.run_task(follow_up)
            mode = runtime.agent.approval_mode
            await runtime.close()
            return planned, follow_up, done, mode, events, server.requests

    planned, follow_up, done, mode, events, requests = asyncio.run(scenario())
    assert planned.plan and mode is ApprovalMode.AUTO_EDIT
    assert (done.reason, done.plan, done.final_message) == ("done", False, "Done: add adds.")
    assert "return a + b" in (repo / "calc.py").read_text()
    # The follow-up went without the instruction, after the plan it carries out.
    carried = requests[1]["messages"]
    assert carried[-1] == {"role": "user", "content": follow_up}
    assert {"role": "assistant", "content": PLAN} in carried
    assert [e.type for e in events].count("plan_proposed") == 1
    assert "approval_requested" not in [e.type for e in events]


def test_proceeding_in_ask_mode_asks_before_the_edit(repo):
    asked = []

    async def approve(request):
        from agent.core.tool_runner import ApprovalAnswer

        asked.append(request.tool)
        return ApprovalAnswer(True)

    script = [Reply(PLAN), Reply("", [EDIT]), Reply("Done.")]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, _ = await start(server, approve=approve)
            await runtime.agent.run_task("fix add")
            await runtime.agent.run_task(proceed(runtime.agent, ApprovalMode.ASK))
            await runtime.close()

    asyncio.run(scenario())
    assert asked == ["edit"]
    assert "return a + b" in (repo / "calc.py").read_text()


def test_switching_out_of_plan_mode_during_the_task_proposes_nothing(repo):
    script = [Reply("", [call("read", path="calc.py")]), Reply("Here is what I found.")]

    async def scenario():
        with ScriptedServer(script) as server:
            runtime, events = await start(server)

            def leave_plan_mode(event: Event) -> None:
                if event.type == "tool_result":
                    runtime.agent.approval_mode = ApprovalMode.ASK

            runtime.emitter.add_sink(leave_plan_mode)
            outcome = await runtime.agent.run_task("look at calc")
            await runtime.close()
            return outcome, events

    outcome, events = asyncio.run(scenario())
    assert outcome.reason == "done" and not outcome.plan
    assert "plan_proposed" not in [e.type for e in events]


# -- headless and the REPL ----------------------------------------------------------------


def test_headless_plan_run_exits_0_with_the_plan_as_its_result(repo):
    with ScriptedServer([Reply("", [WRITE]), Reply(PLAN)]) as server:
        result = run_cli("fix add", *attached(server.url, "--approval", "plan"))
    assert result.exit_code == 0, result.stdout
    assert [e["text"] for e in result.of_type("plan_proposed")] == [PLAN]
    assert result.final["final_message"] == PLAN and result.final["exit_code"] == 0
    denied = result.of_type("tool_result")[0]
    assert not denied["ok"] and "plan mode does not allow changes" in denied["output"]
    assert not result.of_type("approval_requested")
    assert not (repo / "notes.txt").exists()


def test_headless_plan_prints_the_plan_on_stdout_and_how_to_carry_it_out(repo):
    with ScriptedServer([Reply(PLAN)]) as server:
        result = run_cli("fix add", "--attach", server.url, "--approval", "plan")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == PLAN
    assert "[plan proposed (plan mode): nothing was changed]" in result.stderr
    assert "--approval auto-edit" in result.stderr and "--resume " in result.stderr


def repl(url: str, input: str, *extra: str):
    args = ["--attach", url, "--context-window", "32768", *extra]
    return CliRunner().invoke(app, args, input=input, catch_exceptions=False)


def test_repl_asks_how_to_carry_out_the_plan_and_does(repo):
    script = [Reply(PLAN), Reply("Fixing.", [EDIT]), Reply("Done.")]
    with ScriptedServer(script) as server:
        result = repl(server.url, "/plan fix add\n2\n/quit\n")
    assert result.exit_code == 0, result.output
    assert "carry out this plan? [1] ask, [2] auto-edit" in result.output
    assert "[approval mode is now auto-edit; carrying out the plan]" in result.output
    assert "allow?" not in result.output  # auto-edit: the edit went without asking
    assert "return a + b" in (repo / "calc.py").read_text()
    assert user_messages(server.requests[0])[-1] == f"fix add\n\n{INSTRUCTION}"
    assert user_messages(server.requests[1])[-1] == APPROVED


def test_repl_keeps_planning_on_enter_and_revises_the_plan(repo):
    script = [Reply(PLAN), Reply("1. Fix add.\n2. Add a test for negatives.")]
    with ScriptedServer(script) as server:
        result = repl(
            server.url, "fix add\n\nalso test negatives\n4\n/quit\n", "--approval", "plan"
        )
    assert result.exit_code == 0, result.output
    assert result.output.count("carry out this plan?") == 2
    assert "[still in plan mode: type what to change in the plan]" in result.output
    assert user_messages(server.requests[1])[-1] == f"also test negatives\n\n{INSTRUCTION}"
    assert "return a - b" in (repo / "calc.py").read_text()
