"""The TUI against the scripted server: streamed answers, approvals, diffs, undo, interrupts."""

from __future__ import annotations

import json

import pytest
from textual.widgets import Input

from agent.tui.widgets.approval import ApprovalPrompt
from agent.tui.widgets.assistant import AssistantBlock
from agent.tui.widgets.diff_block import DiffBlock
from agent.tui.widgets.reasoning import ReasoningBlock
from agent.tui.widgets.tool_block import ToolBlock
from agent.tui.widgets.user_block import UserBlock
from tests.agent.scripted_server import Reply, ScriptedServer, call
from tests.agent.tui.helpers import make_app, ready, send, settle, shows, wait_until

pytestmark = pytest.mark.anyio

EDIT = call("edit", path="calc.py", old_string="return a - b", new_string="return a + b")
ANSWER = "Here is the plan:\n\n- read `calc.py`\n- fix **add**\n\nDone streaming."


async def test_a_prompt_streams_markdown_and_the_status_bar_counts(repo, tmp_path):
    with ScriptedServer([Reply(ANSWER, reasoning="Let me think.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "plan it")
            await settle(pilot)
            [user] = app.query(UserBlock)
            assert user.text == "plan it"
            [answer] = app.query(AssistantBlock)
            assert answer.text == ANSWER and not answer.streaming
            assert answer.source == ANSWER  # what the Markdown widget parsed
            [thinking] = app.query(ReasoningBlock)
            assert thinking.text == "Let me think."
            await shows(pilot, "Done streaming.", "read calc.py")
            request = server.requests[0]
            prompt = len(json.dumps(request["messages"])) // 4  # what the server reports
            status = app.status
            assert status.prompt == prompt and status.cached == prompt // 2
            assert status.model == "scripted-model" and status.engine == server.url
            assert status.rate is not None and status.rate > 0
            assert "cache 50%" in str(status.summary()) or "cache 49%" in str(status.summary())


async def test_approving_an_edit_shows_the_diff_and_changes_the_file(repo, tmp_path):
    with ScriptedServer([Reply("I will fix it.", [EDIT]), Reply("Fixed add.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "fix add")
            await wait_until(pilot, lambda: app.query(ApprovalPrompt), "the approval prompt")
            prompt = app.query_one(ApprovalPrompt)
            assert prompt.has_focus
            [preview] = prompt.query(DiffBlock)
            assert preview.paths == ["calc.py"]
            assert "return a - b" in preview.files[0].before_text
            assert "return a + b" in preview.files[0].after_text
            [block] = app.query(ToolBlock)
            assert block.status == "pending"
            assert "return a - b" in (repo / "calc.py").read_text()  # nothing ran yet
            await pilot.press("y")
            await settle(pilot)
            assert "return a + b" in (repo / "calc.py").read_text()
            assert block.status == "done" and not block.collapsed
            assert block.diff is not None and block.diff.paths == ["calc.py"]
            assert not app.query(ApprovalPrompt)
            await shows(pilot, "calc.py (+1, -1)", "Fixed add.")
            tool_message = server.requests[1]["messages"][-1]
            assert tool_message["role"] == "tool" and "Edited calc.py" in tool_message["content"]

            await send(pilot, "/diff")
            await wait_until(pilot, lambda: len(app.query(DiffBlock)) == 2, "the /diff output")
            assert app.query(DiffBlock).last().paths == ["calc.py"]


async def test_denying_an_edit_tells_the_model_why(repo, tmp_path):
    with ScriptedServer([Reply("I will fix it.", [EDIT]), Reply("Understood.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "fix add")
            await wait_until(pilot, lambda: app.query(ApprovalPrompt), "the approval prompt")
            await pilot.press("n")
            reason = app.query_one(ApprovalPrompt).query_one(Input)
            assert reason.has_focus
            reason.value = "write a test first"
            await pilot.press("enter")
            await settle(pilot)
            assert "return a - b" in (repo / "calc.py").read_text()
            [block] = app.query(ToolBlock)
            assert block.status == "denied"
            tool_message = server.requests[1]["messages"][-1]
            assert tool_message["role"] == "tool"
            assert "denied" in tool_message["content"]
            assert "write a test first" in tool_message["content"]
            await shows(pilot, "Understood.")


async def test_allowing_for_the_session_is_not_asked_again(repo, tmp_path):
    second = call("edit", path="calc.py", old_string="return a + b", new_string="return b + a")
    script = [Reply("", [EDIT]), Reply("Once."), Reply("", [second]), Reply("Twice.")]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "fix add")
            await wait_until(pilot, lambda: app.query(ApprovalPrompt), "the approval prompt")
            await pilot.press("a")
            await settle(pilot)
            await send(pilot, "swap")
            await settle(pilot)
            assert "return b + a" in (repo / "calc.py").read_text()
            assert [b.status for b in app.query(ToolBlock)] == ["done", "done"]
            assert len(server.requests) == 4


async def test_undo_restores_the_file_and_takes_the_task_back(repo, tmp_path):
    with ScriptedServer([Reply("I will fix it.", [EDIT]), Reply("Done.")]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "fix add")
            await wait_until(pilot, lambda: app.query(ApprovalPrompt), "the approval prompt")
            await pilot.press("y")
            await settle(pilot)
            assert "return a + b" in (repo / "calc.py").read_text()
            await send(pilot, "/undo")
            await wait_until(pilot, lambda: "return a - b" in (repo / "calc.py").read_text())
            await wait_until(pilot, lambda: not app.query(UserBlock), "the task to go")
            assert app.prompt.text == "fix add"  # the message comes back to edit
            await shows(pilot, "Undone: back to checkpoint")
            assert not app.query(ToolBlock)
            assert len(server.requests) == 2


async def test_ctrl_c_interrupts_the_stream_and_the_session_goes_on(repo, tmp_path):
    script = [Reply("Thinking hard", stall=True), Reply("Still here.")]
    with ScriptedServer(script) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            await send(pilot, "think")
            await wait_until(pilot, server.stalled.is_set, "the stream to stall")
            await shows(pilot, "Thinking hard")
            await pilot.press("ctrl+c")
            await settle(pilot)
            await wait_until(pilot, server.aborted.is_set, "the request to be cut off")
            await shows(pilot, "Interrupted.")
            assert app.is_running  # one press interrupts, it does not quit
            await send(pilot, "are you there?")
            await settle(pilot)
            await shows(pilot, "Still here.")
    second = server.requests[1]["messages"]
    assert any("[interrupted by the user]" in (m.get("content") or "") for m in second)


async def test_ctrl_c_twice_quits_and_closes_the_session(repo, tmp_path):
    with ScriptedServer([]) as server:
        app = make_app(server.url, repo, tmp_path)
        async with app.run_test(size=(110, 40)) as pilot:
            await ready(pilot)
            session_dir = app.bridge.runtime.session.dir
            await pilot.press("ctrl+c")
            assert app.is_running
            await pilot.press("ctrl+c")
            await wait_until(pilot, lambda: not app.is_running, "the app to quit")
    assert app.return_value == 0
    last = (session_dir / "events.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["type"] == "session_completed"
