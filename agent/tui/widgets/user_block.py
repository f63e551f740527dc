"""What the user asked, as sent."""

from __future__ import annotations

from textual.widgets import Static


class UserBlock(Static):
    DEFAULT_CSS = """
    UserBlock {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        border-left: thick $primary;
        background: $primary 10%;
        color: $text;
    }
    """

    def __init__(self, text: str, **kwargs) -> None:
        super().__init__(text, markup=False, **kwargs)
        self.text = text
