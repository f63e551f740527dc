"""The question after a plan: carry it out in ask, auto-edit or full-auto, or keep planning.

Shown below the plan the model proposed in plan mode (agent/core/plan_mode.py
holds the choices and what proceeding does). Keys 1-4 pick a choice; Esc or
"keep planning" leaves plan mode on and returns to the input box, where the
user types what to change in the plan.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalGroup
from textual.message import Message
from textual.widgets import Button, Static

from agent.core.plan_mode import PLAN_CHOICES, PlanChoice


class PlanPrompt(VerticalGroup, can_focus=True):
    BINDINGS = [
        *(
            Binding(str(number), f"choose({number - 1})", choice.label, show=False)
            for number, choice in enumerate(PLAN_CHOICES, start=1)
        ),
        Binding("escape", f"choose({len(PLAN_CHOICES) - 1})", "Keep planning", show=False),
    ]
    DEFAULT_CSS = """
    PlanPrompt {
        height: auto;
        margin: 1 0;
        padding: 0 1;
        border: round $success;
        background: $success 5%;
    }
    PlanPrompt:focus-within { border: round $accent; }
    PlanPrompt > .question { height: auto; }
    PlanPrompt > Horizontal { height: auto; margin: 1 0 0 0; }
    PlanPrompt Button { margin: 0 1 0 0; min-width: 10; }
    """

    class Chosen(Message):
        def __init__(self, choice: PlanChoice) -> None:
            super().__init__()
            self.choice = choice

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.answered = False

    def compose(self) -> ComposeResult:
        question = Text()
        question.append("Carry out this plan?", style="bold")
        question.append("  Pick the mode to carry it out in, or keep planning.", style="dim")
        yield Static(question, classes="question")
        with Horizontal():
            for number, choice in enumerate(PLAN_CHOICES, start=1):
                button = Button(
                    f"{choice.label} ({number})",
                    id=f"plan-{choice.mode.value}",
                    variant="success" if choice.proceeds else "default",
                    compact=True,
                )
                button.tooltip = choice.description
                yield button

    def action_choose(self, index: int) -> None:
        if self.answered:
            return
        self.answered = True
        self.post_message(self.Chosen(PLAN_CHOICES[index]))

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        ids = [f"plan-{choice.mode.value}" for choice in PLAN_CHOICES]
        self.action_choose(ids.index(event.button.id or ids[-1]))
