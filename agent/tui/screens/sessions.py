"""`/sessions`: this repository's sessions, most recent first; Enter resumes one."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from agent.core.session import SessionMeta


def describe(meta: SessionMeta, current: str) -> Text:
    when = datetime.fromtimestamp(meta.updated_at).strftime("%Y-%m-%d %H:%M")
    text = Text()
    text.append(when, style="dim")
    text.append("  ")
    text.append(meta.title or "(no messages yet)", style="bold")
    text.append(f"  {meta.id}", style="dim")
    if meta.id == current:
        text.append("  (this session)", style="italic")
    return text


class SessionsScreen(ModalScreen[str | None]):
    """Dismisses with the chosen session's id, or None."""

    BINDINGS = [Binding("escape", "dismiss_none", "Back")]
    DEFAULT_CSS = """
    SessionsScreen { align: center middle; }
    SessionsScreen > Vertical {
        width: 90%;
        height: auto;
        max-height: 80%;
        border: round $accent;
        background: $panel;
        padding: 0 1;
    }
    SessionsScreen OptionList { height: auto; max-height: 20; border: none; }
    """

    def __init__(self, sessions: list[SessionMeta], current: str) -> None:
        super().__init__()
        self.sessions = sessions
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Sessions of this repository · Enter resumes · Esc goes back")
            options = [Option(describe(m, self.current), id=m.id) for m in self.sessions]
            yield OptionList(*options)

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
