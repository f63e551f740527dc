"""The banner across the top when the engine cannot be reached, and while it is retried."""

from __future__ import annotations

from textual.widgets import Static


class ConnectionBanner(Static):
    DEFAULT_CSS = """
    ConnectionBanner {
        dock: top;
        height: auto;
        padding: 0 1;
        background: $error;
        color: $text;
        text-style: bold;
        display: none;
    }
    ConnectionBanner.-shown { display: block; }
    ConnectionBanner.-restored { background: $success; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self.lost = False
        self.text = ""

    def _show(self, text: str) -> None:
        self.text = text
        self.update(text)
        self.add_class("-shown")

    def show_lost(self, where: str, attempt: int, wait_s: float) -> None:
        self.lost = True
        self.remove_class("-restored")
        self._show(
            f"Cannot reach {where}. Checking again in {wait_s:.0f}s "
            f"(attempt {attempt}); ctrl+c twice quits."
        )

    def show_restored(self, where: str) -> None:
        self.lost = False
        self.add_class("-restored")
        self._show(f"Connected to {where} again. Send your message again (↑ recalls it).")

    def hide(self) -> None:
        self.lost = False
        self.text = ""
        self.remove_class("-shown", "-restored")
