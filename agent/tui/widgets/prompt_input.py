"""The input box: several lines, Enter sends, ctrl+j adds a line, ↑/↓ walk the history,
Tab (or Enter) takes a completion of `/commands` and `@paths` from the menu above."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

from agent.core.custom_commands import CustomCommand
from agent.tui.completion import complete, wants_commands
from agent.tui.prompt_history import PromptHistory
from agent.tui.widgets.completion_menu import CompletionMenu


class PromptInput(TextArea):
    BINDINGS = [
        Binding("enter", "send", "Send"),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline", key_display="ctrl+j"),
    ]
    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 12;
        margin: 0 1;
        border: round $primary 60%;
        background: $surface;
    }
    PromptInput:focus { border: round $accent; }
    """

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(
        self,
        menu: CompletionMenu,
        history: PromptHistory,
        commands: Callable[[], Sequence[CustomCommand]] = tuple,
        **kwargs,
    ) -> None:
        super().__init__(
            soft_wrap=True,
            tab_behavior="focus",
            highlight_cursor_line=False,
            placeholder="Ask, or / for commands, @ for files. Enter sends, ctrl+j adds a line.",
            **kwargs,
        )
        self.menu = menu
        self.prompt_history = history
        self.files: Sequence[str] = ()
        self.custom_commands = commands  # read when `/` completion needs them

    # -- keys ----------------------------------------------------------------------------

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            event.prevent_default()
            event.stop()
            if self.menu.is_open:
                self.accept_completion()
            else:
                self.action_send()
        elif self.menu.is_open and key in ("tab", "escape"):
            event.prevent_default()
            event.stop()
            if key == "tab":
                self.accept_completion()
            else:
                self.menu.close()

    def action_send(self) -> None:
        text = self.text.strip()
        if not text:
            return
        self.prompt_history.add(text)
        self.menu.close()
        self.clear()
        self.post_message(self.Submitted(text))

    def action_newline(self) -> None:
        self.insert("\n")

    def action_cursor_up(self, select: bool = False) -> None:
        if self.menu.is_open and not select:
            self.menu.move(-1)
        elif self.cursor_location[0] == 0 and not select:
            self._recall(self.prompt_history.previous(self.text))
        else:
            super().action_cursor_up(select)

    def action_cursor_down(self, select: bool = False) -> None:
        last_row = self.document.line_count - 1
        if self.menu.is_open and not select:
            self.menu.move(1)
        elif self.cursor_location[0] == last_row and not select:
            self._recall(self.prompt_history.next())
        else:
            super().action_cursor_down(select)

    def _recall(self, text: str | None) -> None:
        if text is None:
            return
        self.load_text(text)
        self.move_cursor(self.document.end)

    def put(self, text: str) -> None:
        """Replace what is typed (e.g. with a message taken back by /undo)."""
        self._recall(text)

    # -- completion ----------------------------------------------------------------------

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self.update_completion()

    def update_completion(self) -> None:
        row, column = self.cursor_location
        line = self.document.get_line(row)[:column]
        first_line = row == 0
        custom = self.custom_commands() if wants_commands(line, first_line=first_line) else ()
        found = complete(line, first_line=first_line, files=self.files, commands=custom)
        if found is None:
            self.menu.close()
        else:
            self.menu.show(found)

    def accept_completion(self) -> None:
        item = self.menu.chosen()
        completions = self.menu.completions
        self.menu.close()
        if item is None or completions is None:
            return
        row, column = self.cursor_location
        self.replace(item.insert, (row, completions.start), (row, column))
        self.move_cursor((row, completions.start + len(item.insert)))
