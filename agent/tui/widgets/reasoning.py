"""The model's thinking: dimmed, in a block the user can fold away."""

from __future__ import annotations

from textual.widgets import Collapsible, Static


class ReasoningBlock(Collapsible):
    DEFAULT_CSS = """
    ReasoningBlock {
        height: auto;
        margin: 1 0 0 0;
        padding: 0;
        border: none;
        background: transparent;
        color: $text-muted;
        text-style: italic;
    }
    ReasoningBlock > Contents { padding: 0 0 0 2; }
    ReasoningBlock .reasoning-text { color: $text-muted; }
    """

    def __init__(self, text: str = "", collapsed: bool = False, **kwargs) -> None:
        self._body = Static(text, markup=False, classes="reasoning-text")
        super().__init__(self._body, title="thinking", collapsed=collapsed, **kwargs)
        self.text = text

    def append(self, fragment: str) -> None:
        self.text += fragment
        self._body.update(self.text)
