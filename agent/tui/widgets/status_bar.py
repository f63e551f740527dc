"""The line under the input: model, engine, KV dtype, context meter, cache share, tokens/s.

Every number comes from the agent's events: `session_started` (window,
approval), `context_snapshot` (resident tokens), `usage` (prompt, cached and
generated tokens). Tokens/s is the decode rate: a turn's generated tokens
after the first, over the time from its first streamed delta to its `usage`,
measured here as the events arrive (prefill time is left out).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual.widgets import Static

from agent.core.engine_facts import EngineFacts
from agent.core.events import (
    ContextSnapshot,
    Event,
    ReasoningDeltaEvent,
    SessionStarted,
    TextDelta,
    TurnStarted,
    Usage,
)
from agent.tui.format import tokens
from tools import ApprovalMode

METER_CELLS = 10


def meter(resident: int, used: int, window: int, cells: int = METER_CELLS) -> Text:
    """Resident tokens, then the rest of the prompt, then free room, as block cells."""
    text = Text()
    if window <= 0:
        return text.append("░" * cells, style="dim")
    resident_cells = min(cells, round(cells * resident / window))
    used_cells = min(cells, max(resident_cells, round(cells * used / window)))
    if used > 0 and used_cells == 0:
        used_cells = 1
    text.append("█" * resident_cells, style="cyan")
    text.append("█" * (used_cells - resident_cells), style="magenta")
    text.append("░" * (cells - used_cells), style="dim")
    return text


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; padding: 0 1; background: $panel; color: $text; }
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, **kwargs) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.model = ""
        self.engine = ""
        self.kv_dtype: str | None = None
        self.window = 0
        self.resident = 0
        self.prompt = 0
        self.cached: int | None = None
        self.rate: float | None = None
        self.approval = ""
        self._first_delta: float | None = None
        self._in_turn = False

    def on_mount(self) -> None:
        self._redraw()

    def set_engine(self, facts: EngineFacts) -> None:
        self.model = facts.model
        self.engine = facts.engine
        self.kv_dtype = facts.kv_cache_dtype
        self._redraw()

    def set_approval(self, mode: str) -> None:
        self.approval = mode
        self._redraw()

    def on_agent_event(self, event: Event) -> None:
        if isinstance(event, SessionStarted):
            self.window = event.context_window
            self.approval = event.approval
            self.prompt = 0
            self.cached = None
        elif isinstance(event, ContextSnapshot):
            self.resident = event.tokens
        elif isinstance(event, TurnStarted):
            self._in_turn, self._first_delta = True, None
            return
        elif isinstance(event, TextDelta | ReasoningDeltaEvent):
            if self._in_turn and self._first_delta is None:
                self._first_delta = self.clock()
            return
        elif isinstance(event, Usage):
            self.window = event.context_window or self.window
            self.resident = event.resident_tokens
            self.prompt = event.prompt_tokens
            self.cached = event.cached_tokens
            if self._first_delta is not None and event.completion_tokens > 1:
                elapsed = self.clock() - self._first_delta
                if elapsed > 0:
                    self.rate = (event.completion_tokens - 1) / elapsed
            self._in_turn, self._first_delta = False, None
        else:
            return
        self._redraw()

    @property
    def cache_share(self) -> float | None:
        if self.cached is None or self.prompt <= 0:
            return None
        return self.cached / self.prompt

    def parts(self) -> list[tuple[int, Text]]:
        """(priority, text) in display order; the lowest priorities go first when narrow."""
        engine = self.engine.removeprefix("http://").removeprefix("https://") or "starting"
        used = max(self.prompt, self.resident)
        context = meter(self.resident, used, self.window)
        window = tokens(self.window) if self.window else "?"
        context.append(f" {tokens(self.resident)}/{window} res")
        share = self.cache_share
        parts = [
            (9, Text(self.model or "…", style="bold")),
            (7, Text(engine)),
            (6, Text(f"KV {self.kv_dtype or '?'}")),
            (8, context),
            (3, Text(f"prompt {tokens(self.prompt)}")),
            (5, Text(f"cache {share:.0%}" if share is not None else "cache –")),
            (4, Text(f"{self.rate:.1f} tok/s" if self.rate is not None else "– tok/s")),
        ]
        if self.approval == ApprovalMode.PLAN.value:
            # Plan mode changes what the agent does the most: it is the last part to go.
            parts.append((10, Text("plan mode", style="bold green")))
        elif self.approval:
            parts.append((2, Text(self.approval, style="italic")))
        return parts

    def summary(self, width: int | None = None) -> Text:
        parts = self.parts()
        while width is not None and len(parts) > 1:
            length = sum(len(t) for _, t in parts) + 3 * (len(parts) - 1)
            if length <= width:
                break
            lowest = min(range(len(parts)), key=lambda i: parts[i][0])
            parts.pop(lowest)
        return Text(" · ", style="dim").join(t for _, t in parts)

    def render(self) -> Text:
        return self.summary(self.content_size.width or None)

    def _redraw(self) -> None:
        self.refresh()
