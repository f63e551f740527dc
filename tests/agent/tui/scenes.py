"""Fixed event streams for snapshot tests and the docs' screen capture.

`ReplayBridge` stands where the agent's bridge stands and plays a recorded
event stream, so a screen can be drawn with no clocks, ports, temp paths or
session ids in it. Everything on screen still comes from agent events, drawn
by the real widgets.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from agent.core.approval_preview import DiffPreview
from agent.core.context_report import ContextReport, FileTokens
from agent.core.engine_facts import EngineFacts
from agent.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CheckpointTaken,
    ContextSnapshot,
    Event,
    ReasoningDeltaEvent,
    SessionStarted,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    TurnCompleted,
    TurnStarted,
    Usage,
    UserMessage,
)
from agent.core.runtime import RuntimeOptions
from agent.core.tool_runner import ApprovalRequest
from agent.tui import ResidentApp
from agent.tui.bridge import AgentBridge
from agent.tui.messages import AgentEvent, ApprovalNeeded, EngineInfo
from tools import ApprovalMode

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = CALC.replace("a - b", "a + b")
DIFF = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n def add(a, b):\n"
    "-    return a - b\n+    return a + b\n \n \n def mul(a, b):\n"
)
EDIT_ARGS = '{"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"}'

START: list[Event] = [
    SessionStarted(
        session_id="20250101-120000-demo",
        model="smollm2-135m-instruct (local engine)",
        workspace="/work/calc",
        approval="ask",
        context_window=32768,
    ),
    ContextSnapshot(epoch=1, files=3, tokens=412, mode="full"),
]
ANSWER = (
    "`add` subtracts instead of adding:\n\n```python\ndef add(a, b):\n    return a - b\n```\n\n"
    "The test expects `add(2, 3) == 5`."
)
MAIN: list[Event] = [
    *START,
    UserMessage(text="Why does test_add fail?"),
    TurnStarted(turn=1),
    ReasoningDeltaEvent(text="The test calls add(2, 3); read calc.py first."),
    ToolCallEvent(id="call_1", name="read", arguments='{"path": "calc.py"}'),
    ToolResultEvent(id="call_1", ok=True, output=CALC),
    TurnCompleted(turn=1, finish_reason="tool_calls"),
    TurnStarted(turn=2),
    *[TextDelta(text=ANSWER[i : i + 9]) for i in range(0, len(ANSWER), 9)],
    Usage(
        prompt_tokens=1210,
        completion_tokens=48,
        cached_tokens=1089,
        resident_tokens=412,
        context_window=32768,
    ),
    TurnCompleted(turn=2, finish_reason="stop"),
]
EDIT: list[Event] = [
    *START,
    UserMessage(text="Fix it."),
    TurnStarted(turn=1),
    TextDelta(text="I will make `add` add."),
    ToolCallEvent(id="call_2", name="edit", arguments=EDIT_ARGS),
    ApprovalRequested(
        id="call_2",
        name="edit",
        request="Edit calc.py",
        reason="ask mode asks before changing files",
    ),
]
APPROVAL_REQUEST = ApprovalRequest(
    call_id="call_2",
    tool="edit",
    request="Edit calc.py",
    reason="ask mode asks before changing files",
    arguments={"path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"},
)
EDITED: list[Event] = [
    *EDIT,
    ApprovalResolved(id="call_2", approved=True, by="user"),
    CheckpointTaken(checkpoint_id="20250101T120100-demo", history_length=0),
    ToolResultEvent(
        id="call_2",
        ok=True,
        output=f"Edited calc.py: 1 replacement.\n{DIFF}",
        data={"path": "calc.py", "replacements": 1, "diff": DIFF},
    ),
    TurnCompleted(turn=1, finish_reason="tool_calls"),
    TurnStarted(turn=2),
    TextDelta(text="Fixed: `add` returns `a + b` now."),
    Usage(
        prompt_tokens=1320,
        completion_tokens=24,
        cached_tokens=1210,
        resident_tokens=412,
        context_window=32768,
    ),
    TurnCompleted(turn=2, finish_reason="stop"),
]
REPORT = ContextReport(
    epoch=1,
    mode="full",
    window=32768,
    fixed_tokens=640,
    snapshot_tokens=412,
    conversation_tokens=158,
    messages=4,
    token_count="tokenizer",
    files=[
        FileTokens("test_calc.py", 171),
        FileTokens("calc.py", 139, stale=True),
        FileTokens("README.md", 52),
    ],
    omitted=[("uv.lock", "rule")],
)
FACTS = EngineFacts(model="smollm2-135m-instruct", engine="local", kv_cache_dtype="fp8_e4m3")


class ReplayBridge(AgentBridge):
    def __init__(self, post, events: list[Event], approval: bool = False) -> None:
        super().__init__(post, RuntimeOptions(workspace=Path("/work/calc")))
        self.events = events
        self.approval = approval

    async def open(self) -> None:
        self.post(EngineInfo(FACTS))
        for event in self.events:
            self.post(AgentEvent(event))
        if self.approval:
            preview = DiffPreview("calc.py", CALC, FIXED)
            self.post(ApprovalNeeded(APPROVAL_REQUEST, preview))

    async def close(self) -> None:
        pass

    def approval_mode(self) -> ApprovalMode:
        return ApprovalMode.ASK

    async def context_report(self) -> ContextReport:
        return REPORT

    async def engine_reachable(self) -> bool:
        return True


def replay_app(events: list[Event], approval: bool = False, tmp: Path | None = None) -> ResidentApp:
    ticks = itertools.count(0.0, 0.5)  # each clock reading half a second after the last
    app = ResidentApp(
        RuntimeOptions(workspace=Path("/work/calc")),
        clock=lambda: next(ticks),
        history_path=(tmp / "history.jsonl") if tmp else Path("/nonexistent/history.jsonl"),
    )
    app.bridge = ReplayBridge(app.post_message, events, approval)
    return app
