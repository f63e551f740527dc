"""The question for one tool call that needs the user: allow once, for the session, or deny.

Only the call that asks waits: the rest of the screen stays live. A denial
may carry a reason, which the model reads in the call's result.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalGroup
from textual.message import Message
from textual.widgets import Button, Input, Static

from agent.core.approval_preview import CommandPreview, DiffPreview, Preview
from agent.core.tool_runner import ApprovalAnswer, ApprovalRequest
from agent.tui.widgets.diff_block import DiffBlock


class ApprovalPrompt(VerticalGroup, can_focus=True):
    BINDINGS = [
        Binding("y", "allow_once", "Allow once"),
        Binding("a", "allow_session", "Allow for session"),
        Binding("n", "deny", "Deny"),
    ]
    DEFAULT_CSS = """
    ApprovalPrompt {
        height: auto;
        margin: 1 0;
        padding: 0 1;
        border: round $warning;
        background: $warning 5%;
    }
    ApprovalPrompt:focus-within { border: round $accent; }
    ApprovalPrompt > .question { height: auto; }
    ApprovalPrompt > .command { background: $surface; padding: 0 1; margin: 1 0 0 0; }
    ApprovalPrompt > Horizontal { height: auto; margin: 1 0 0 0; }
    ApprovalPrompt Button { margin: 0 1 0 0; min-width: 10; }
    ApprovalPrompt > Input { display: none; margin: 1 0 0 0; }
    ApprovalPrompt.-denying > Input { display: block; }
    """

    class Answered(Message):
        def __init__(self, request: ApprovalRequest, answer: ApprovalAnswer, remember: bool):
            super().__init__()
            self.request = request
            self.answer = answer
            self.remember = remember

    def __init__(self, request: ApprovalRequest, preview: Preview, **kwargs) -> None:
        super().__init__(**kwargs)
        self.request = request
        self.preview = preview
        self.answered = False

    def compose(self) -> ComposeResult:
        question = Text()
        if self.request.parent_id:
            question.append("Subagent: ", style="italic")
        question.append(self.request.request, style="bold")
        question.append(" — allow?")
        question.append(f"  ({self.request.reason})", style="dim")
        yield Static(question, classes="question")
        if isinstance(self.preview, DiffPreview):
            yield DiffBlock.from_texts(self.preview.path, self.preview.before, self.preview.after)
        elif isinstance(self.preview, CommandPreview):
            where = f"   (in {self.preview.workdir})" if self.preview.workdir else ""
            yield Static(f"$ {self.preview.command}{where}", markup=False, classes="command")
        with Horizontal():
            yield Button("Allow once (y)", id="allow-once", variant="success", compact=True)
            if not self.request.once:  # Resident's configuration: asked every time
                yield Button("Allow for session (a)", id="allow-session", compact=True)
            yield Button("Deny (n)", id="deny", variant="error", compact=True)
        yield Input(placeholder="Why not? The model reads this (optional). Enter sends.")

    def _answer(self, answer: ApprovalAnswer, remember: bool = False) -> None:
        if self.answered:
            return
        self.answered = True
        self.post_message(self.Answered(self.request, answer, remember))

    def action_allow_once(self) -> None:
        self._answer(ApprovalAnswer(True))

    def action_allow_session(self) -> None:
        if self.request.once:  # never remembered (SessionApprovals): say so by allowing once
            self.action_allow_once()
            return
        self._answer(ApprovalAnswer(True, "allowed for this session"), remember=True)

    def action_deny(self) -> None:
        self.add_class("-denying")
        self.query_one(Input).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        {
            "allow-once": self.action_allow_once,
            "allow-session": self.action_allow_session,
            "deny": self.action_deny,
        }[event.button.id or "deny"]()

    @on(Input.Submitted)
    def _reason(self, event: Input.Submitted) -> None:
        event.stop()
        self._answer(ApprovalAnswer(False, event.value.strip()))
