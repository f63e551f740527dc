"""The ACP front end's parts on their own: events to updates, approvals, prompt text, stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from acp import (
    RequestError,
    audio_block,
    embedded_text_resource,
    resource_block,
    resource_link_block,
    text_block,
)
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    DeniedOutcome,
    RequestPermissionResponse,
    ToolCallProgress,
    ToolCallStart,
    UsageUpdate,
    UserMessageChunk,
)

from agent.acp import engines
from agent.acp.permissions import PermissionBridge
from agent.acp.prompt import prompt_text
from agent.acp.updates import UpdateTranslator, replay_updates
from agent.core.clients import LLMClient
from agent.core.events import (
    ApprovalResolved,
    ErrorEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    Usage,
    UserMessage,
)
from agent.core.runtime import RuntimeOptions
from agent.core.tool_runner import ApprovalRequest
from tests.agent.acp.acp_client import ROOT

EDIT_ARGS = {"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}


def edit_call(call_id: str = "call_1") -> ToolCallEvent:
    return ToolCallEvent(id=call_id, name="edit", arguments=json.dumps(EDIT_ARGS))


# -- events to updates -------------------------------------------------------------------


def test_a_live_edit_shows_its_diff_pending_and_done(tmp_path):
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    translate = UpdateTranslator(tmp_path)
    (start,) = translate(edit_call())
    assert isinstance(start, ToolCallStart)
    assert (start.kind, start.title, start.status) == ("edit", "Edit calc.py", "pending")
    assert start.locations[0].path == str(tmp_path / "calc.py")
    (diff,) = start.content
    assert diff.type == "diff" and diff.old_text.endswith("a - b\n")
    assert diff.new_text.endswith("a + b\n")
    assert translate.call_content("call_1") == [diff]  # for the permission request
    (running,) = translate(ApprovalResolved(id="call_1", approved=True, by="user"))
    assert running.status == "in_progress"
    (done,) = translate(ToolResultEvent(id="call_1", ok=True, output="Edited calc.py"))
    assert isinstance(done, ToolCallProgress)
    assert done.status == "completed" and done.content == [diff]


def test_a_failed_call_reports_its_error_as_text(tmp_path):
    translate = UpdateTranslator(tmp_path)
    translate(ToolCallEvent(id="c", name="shell", arguments='{"command": "pytest -q"}'))
    (done,) = translate(ToolResultEvent(id="c", ok=False, output="exit code 1\nFAILED"))
    assert done.status == "failed"
    assert done.content[0].content.text == "```\nexit code 1\nFAILED\n```"


def test_text_usage_errors_and_stop_details(tmp_path):
    translate = UpdateTranslator(tmp_path)
    assert translate(UserMessage(text="hi")) == []  # live: the client drew it already
    (chunk,) = translate(TextDelta(text="Hel"))
    assert isinstance(chunk, AgentMessageChunk) and chunk.content.text == "Hel"
    usage = Usage(
        prompt_tokens=900, completion_tokens=100, cached_tokens=0, resident_tokens=0,
        context_window=8192,
    )  # fmt: skip
    (level,) = translate(usage)
    assert isinstance(level, UsageUpdate) and (level.used, level.size) == (1000, 8192)
    (note,) = translate(ErrorEvent(message="checkpoint failed", kind="checkpoint"))
    assert "checkpoint failed" in note.content.text
    assert translate(TurnCompleted(turn=1, finish_reason="length")) == []
    assert translate.last_finish_reason == "length"


def test_a_replay_is_the_conversation_with_merged_text(tmp_path):
    events = [
        UserMessage(text="fix it"),
        TextDelta(text="I will "),
        TextDelta(text="fix it."),
        edit_call(),
        ToolResultEvent(
            id="call_1",
            ok=True,
            output="Edited calc.py: 1 replacement.\n--- a/calc.py",
            data={"diff": "--- a/calc.py\n+++ b/calc.py\n-a - b\n+a + b\n"},
        ),  # fmt: skip
        TextDelta(text="Done."),
    ]
    updates = replay_updates(events, tmp_path)
    kinds = [type(u) for u in updates]
    assert kinds == [
        UserMessageChunk, AgentMessageChunk, ToolCallStart, ToolCallProgress, AgentMessageChunk,
    ]  # fmt: skip
    assert updates[1].content.text == "I will fix it."
    assert updates[2].content is None  # no diff from today's disk for yesterday's call
    shown = updates[3].content[0].content.text
    assert shown.startswith("Edited calc.py: 1 replacement.\n```diff\n") and "+a + b" in shown


def test_a_replayed_call_that_never_finished_is_shown_failed(tmp_path):
    updates = replay_updates([UserMessage(text="go"), edit_call("call_9")], tmp_path)
    assert isinstance(updates[-1], ToolCallProgress)
    assert (updates[-1].tool_call_id, updates[-1].status) == ("call_9", "failed")


# -- approvals ---------------------------------------------------------------------------


def request(call_id: str = "c1") -> ApprovalRequest:
    return ApprovalRequest(call_id, "edit", "Edit calc.py", "ask mode", arguments=EDIT_ARGS)


def selected(option: str) -> RequestPermissionResponse:
    return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "option, approved, asked_again",
    [
        ("allow-once", True, True),
        ("allow-always", True, False),
        ("reject-once", False, True),
        ("reject-always", False, False),
    ],
)
async def test_each_option_maps_onto_an_answer(option, approved, asked_again):
    asked = []

    async def ask(tool_call, options):
        asked.append(tool_call)
        return selected(option)

    bridge = PermissionBridge(ask)
    first = await bridge.approve(request("c1"), [])
    second = await bridge.approve(request("c2"), [])
    assert first.approved is approved and second.approved is approved
    assert len(asked) == (2 if asked_again else 1)
    assert asked[0].tool_call_id == "c1" and asked[0].kind == "edit"
    assert "ask mode" in asked[0].content[-1].content.text  # why it asks


@pytest.mark.anyio
async def test_a_cancelled_outcome_is_a_denial():
    async def ask(tool_call, options):
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    answer = await PermissionBridge(ask).approve(request(), [])
    assert not answer.approved and "cancelled" in answer.message


# -- prompts -----------------------------------------------------------------------------


def test_mentions_and_embedded_files_become_text(tmp_path):
    link = resource_link_block("calc.py", (tmp_path / "src" / "calc.py").as_uri())
    embedded = resource_block(embedded_text_resource((tmp_path / "a.txt").as_uri(), "A\n"))
    text = prompt_text([text_block("look at "), link, text_block(" and"), embedded], tmp_path)
    assert text == "look at `src/calc.py` and\n\n`a.txt`:\n```\nA\n```"


@pytest.mark.parametrize("blocks", [[audio_block("AAAA", "audio/wav")], [text_block("  ")]])
def test_prompts_without_usable_text_are_refused(tmp_path, blocks):
    with pytest.raises(RequestError) as refused:
        prompt_text(blocks, tmp_path)
    assert refused.value.code == -32602


# -- stdout ------------------------------------------------------------------------------


def test_stdout_is_kept_for_the_protocol():
    script = (
        "import os, sys\n"
        "from agent.acp.stdio import reserve_stdout\n"
        "fd = reserve_stdout()\n"
        "print('stray print'); sys.stdout.flush()\n"
        "os.system('echo from a child')\n"
        'os.write(fd, b\'{"jsonrpc": "2.0"}\\n\')\n'
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"jsonrpc": "2.0"}\n'
    assert "stray print" in done.stderr and "from a child" in done.stderr


# -- the engine behind the sessions ------------------------------------------------------


class FakeLocalClient(LLMClient):
    model = "fake"

    def __init__(self) -> None:
        self.closed = False

    async def context_window(self) -> int:
        return 4096

    def stream(self, request):
        raise NotImplementedError

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.anyio
async def test_local_sessions_share_one_engine(monkeypatch):
    started: list[FakeLocalClient] = []

    def start(model: str) -> FakeLocalClient:
        started.append(FakeLocalClient())
        return started[-1]

    monkeypatch.setattr(engines, "start_local_client", start)
    link = engines.Engines(RuntimeOptions(model="some-model"))
    first, second = await link.client_for_session(), await link.client_for_session()
    assert len(started) == 1 and await second.context_window() == 4096
    await first.aclose()  # a session closing leaves the engine to the others
    assert not started[0].closed
    await link.aclose()
    assert started[0].closed
    assert await engines.Engines(RuntimeOptions(attach="http://x")).client_for_session() is None
