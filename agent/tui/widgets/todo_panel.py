"""The model's todo list, docked above the input while it has items.

Drawn from `todo_updated` events alone, like everything else on screen: each
one carries the whole list. A new session (`/clear`) empties the panel; a
resumed one shows the list its history ends with. A long list shows a window
around the item in progress, so the conversation keeps most of the screen.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from agent.core.events import Event, SessionStarted, TodoItem, TodoUpdated
from agent.core.todo import TODO_MARKS, latest_todos, progress

MAX_SHOWN = 8  # items drawn at once; the rest are counted above and below
STYLES = {"pending": "", "in_progress": "bold", "done": "dim"}


def window(items: Sequence[TodoItem], size: int = MAX_SHOWN) -> tuple[int, int]:
    """The slice [start, end) of `items` to draw: the item in progress (else the first
    one not done) with what comes just before it for context, the rest after it."""
    if len(items) <= size:
        return 0, len(items)
    doing = next((i for i, item in enumerate(items) if item.status == "in_progress"), None)
    if doing is None:
        doing = next((i for i, item in enumerate(items) if item.status != "done"), len(items))
    start = max(0, min(doing - 2, len(items) - size))
    return start, start + size


class TodoPanel(Static):
    DEFAULT_CSS = """
    TodoPanel {
        height: auto;
        margin: 0 1;
        padding: 0 1;
        border: round $primary 60%;
        border-title-color: $text-accent;
        border-title-style: bold;
        display: none;
    }
    TodoPanel.-shown { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.items: list[TodoItem] = []

    def handle(self, event: Event) -> None:
        """Follow the live event stream."""
        if isinstance(event, TodoUpdated):
            self.show_items(event.items)
        elif isinstance(event, SessionStarted) and not event.resumed:
            self.show_items([])  # a new session starts with no list

    def replay(self, events: Sequence[Event]) -> None:
        """A resumed session's history: the list it ended with."""
        self.show_items(latest_todos(events))

    def show_items(self, items: Sequence[TodoItem]) -> None:
        self.items = list(items)
        self.set_class(bool(self.items), "-shown")
        self.border_title = f"Todo {progress(self.items).removesuffix(' done')}"
        self.update(self._render_items())

    def _render_items(self) -> Text:
        start, end = window(self.items)
        text = Text()
        if start:
            text.append(f"  ⋯ {start} more above\n", style="dim")
        for item in self.items[start:end]:
            mark = TODO_MARKS[item.status]
            style = STYLES[item.status]
            text.append(f"{mark} ", style="bold cyan" if item.status == "in_progress" else style)
            text.append(item.content + "\n", style=style)
        if end < len(self.items):
            text.append(f"  ⋯ {len(self.items) - end} more below\n", style="dim")
        text.rstrip()
        return text
