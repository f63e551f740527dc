"""Plan mode in the TUI: `/plan`, the question after a plan, carrying it out or not.

Pilot tests against the scripted model server, and a snapshot of the question
drawn below a plan (regenerate with `--snapshot-update` and look at the SVG).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot

import prompts
from agent.core.events import (
    Event,
    PlanProposed,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    TurnStarted,
    Usage,
    UserMessage,
)
from agent.tui.widgets.approval import ApprovalPrompt
from agent.tui.widgets.notes import Note
from agent.tui.widgets.plan_prompt import PlanPrompt
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tests.agent.tui.helpers import make_app, ready, send, settle, shows, wait_until
from tests.agent.tui.scenes import CALC, START, ReplayBridge, replay_app
from tests.agent.tui.test_snapshots import SIZE, drawn
from tools import ApprovalMode

PLAN = "1. Change `add` in calc.py to return `a + b`.\n2. Run the tests."
EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
INSTRUCTION = prompts.load("plan_mode").strip()
APPROVED = prompts.load("plan_approved").strip()


def users(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def notes(app) -> list[str]:
    return [note.text for note in app.query(Note)]


@pytest.mark.anyio
async def test_plan_then_carry_it_out_in_auto_edit(repo, tmp_path):
    script = [Reply(PLAN), Reply("Fixing.", [EDIT]), Reply("Done: add adds.")]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "/plan fix add")
            await wait_until(pilot, lambda: app.query(PlanPrompt), "the question after the plan")
            assert app.status.approval == "plan"
            await shows(pilot, "plan mode", "Carry out this plan?", "Auto-edit (2)")
            assert any(n.startswith("Plan proposed") for n in notes(app))
            assert app.query_one(PlanPrompt).has_focus
            assert "return a - b" in (repo / "calc.py").read_text()  # nothing changed yet

            await pilot.press("2")
            await wait_until(pilot, lambda: len(server.requests) == 3, "the follow-up")
            await settle(pilot)
            assert app.status.approval == "auto-edit"
            assert app.bridge.approval_mode() is ApprovalMode.AUTO_EDIT
            assert not app.query(PlanPrompt) and not app.query(ApprovalPrompt)
            assert "return a + b" in (repo / "calc.py").read_text()  # not asked: auto-edit
            assert any("now auto-edit; carrying out the plan" in n for n in notes(app))
            await shows(pilot, "Done: add adds.")
    assert users(server.requests[0])[-1] == f"fix add\n\n{INSTRUCTION}"
    assert users(server.requests[1])[-1] == APPROVED
    assert {"role": "assistant", "content": PLAN} in server.requests[1]["messages"]


@pytest.mark.anyio
async def test_keep_planning_and_a_typed_message_revise_the_plan(repo, tmp_path):
    script = [Reply(PLAN), Reply("1. Fix add.\n2. Test negatives."), Reply("1. Fix add only.")]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "/plan")
            await wait_until(pilot, lambda: app.status.approval == "plan", "plan mode")
            await send(pilot, "fix add")
            await wait_until(pilot, lambda: app.query(PlanPrompt), "the first question")
            await pilot.press("escape")  # keep planning
            await wait_until(pilot, lambda: not app.query(PlanPrompt), "the question gone")
            assert any("Still in plan mode" in n for n in notes(app))
            assert app.prompt.has_focus

            await send(pilot, "also test negatives")
            await wait_until(pilot, lambda: app.query(PlanPrompt), "the second question")
            # Typing instead of choosing keeps planning too: the question goes away.
            await send(pilot, "drop the negatives")
            await wait_until(pilot, lambda: len(server.requests) == 3, "the third plan")
            await settle(pilot)
            assert len(app.query(PlanPrompt)) == 1  # only the newest plan's question
            assert app.status.approval == "plan"
    assert [users(r)[-1] for r in server.requests] == [
        f"{text}\n\n{INSTRUCTION}"
        for text in ("fix add", "also test negatives", "drop the negatives")
    ]
    assert "return a - b" in (repo / "calc.py").read_text()


# -- the snapshot ------------------------------------------------------------------------

PLANNED: list[Event] = [
    START[0].model_copy(update={"approval": "plan"}),
    *START[1:],
    UserMessage(text="Fix add."),
    TurnStarted(turn=1),
    ToolCallEvent(id="call_1", name="read", arguments='{"path": "calc.py"}'),
    ToolResultEvent(id="call_1", ok=True, output=CALC),
    TurnCompleted(turn=1, finish_reason="tool_calls"),
    TurnStarted(turn=2),
    *[TextDelta(text=PLAN[i : i + 9]) for i in range(0, len(PLAN), 9)],
    Usage(
        prompt_tokens=1250,
        completion_tokens=30,
        cached_tokens=1089,
        resident_tokens=412,
        context_window=32768,
    ),
    TurnCompleted(turn=2, finish_reason="stop"),
    PlanProposed(text=PLAN),
]


class PlanningBridge(ReplayBridge):
    def approval_mode(self) -> ApprovalMode:
        return ApprovalMode.PLAN


def test_the_question_after_a_plan(snap_compare, tmp_path: Path):
    app = replay_app(PLANNED, tmp=tmp_path)
    app.bridge = PlanningBridge(app.post_message, PLANNED)

    async def offered(pilot: Pilot) -> None:
        await drawn(pilot)
        await pilot.app.offer_plan()
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=offered)
