"""The menu of completions above the input box."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from agent.tui.completion import Completions, Item


class CompletionMenu(OptionList, can_focus=False):
    DEFAULT_CSS = """
    CompletionMenu {
        height: auto;
        max-height: 8;
        margin: 0 1;
        border: none;
        background: $surface;
        display: none;
    }
    CompletionMenu.-open { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.completions: Completions | None = None

    @property
    def is_open(self) -> bool:
        return self.completions is not None

    def show(self, completions: Completions) -> None:
        self.completions = completions
        options = []
        for item in completions.items:
            label = Text(item.label, style="bold")
            if item.help:
                label.append(f"  {item.help}", style="dim")
            options.append(Option(label))
        self.set_options(options)
        self.highlighted = 0
        self.add_class("-open")

    def close(self) -> None:
        self.completions = None
        self.clear_options()
        self.remove_class("-open")

    def move(self, step: int) -> None:
        if not self.option_count:
            return
        current = self.highlighted or 0
        self.highlighted = (current + step) % self.option_count

    def chosen(self) -> Item | None:
        if self.completions is None or self.highlighted is None:
            return None
        return self.completions.items[self.highlighted]
