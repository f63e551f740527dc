"""A line above the input while the agent works: what it is doing, with a spinner.

Long work (loading the model, building the snapshot, compacting, a task)
shows here rather than as a frozen screen.
"""

from __future__ import annotations

from textual.timer import Timer
from textual.widgets import Static

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class WorkIndicator(Static):
    DEFAULT_CSS = """
    WorkIndicator { height: 1; padding: 0 1; color: $text-accent; display: none; }
    WorkIndicator.-busy { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self.words = ""
        self._frame = 0
        self._timer: Timer | None = None

    @property
    def busy(self) -> bool:
        return bool(self.words)

    def start(self, words: str, spin: bool = True) -> None:
        """Show `words`; with a spinner while something runs, without while it waits on you."""
        self.words = words
        self.add_class("-busy")
        if spin and self._timer is None:
            self._timer = self.set_interval(0.1, self._tick)
        elif not spin and self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._draw()

    def stop(self) -> None:
        self.words = ""
        self.remove_class("-busy")
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def _tick(self) -> None:
        self._frame = (self._frame + 1) % len(FRAMES)
        self._draw()

    def _draw(self) -> None:
        symbol = FRAMES[self._frame] if self._timer is not None else "◌"
        self.update(f"{symbol} {self.words}")
