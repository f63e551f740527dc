"""Splitting `<think>...</think>` reasoning from the answer.

Thinking models (Kimi K2 thinking, GLM-4.5+, Qwen3) write their reasoning
first, inside `<think>` tags, then the answer. The rules:

- Reasoning opens only at the very start of the output (after whitespace),
  or before the output begins when the prompt already opened `<think>`
  (`starts_in_reasoning`; see `prompt_opens_reasoning`). A `<think>` later in
  the answer is text the model is writing about, and stays content.
- Reasoning ends at the first `</think>`; with no `</think>` the whole output
  is reasoning (the model ran out of tokens while thinking).
- Reasoning also ends where a tool call begins (`end_at_tool_calls`, which
  `ChatOutputParser` sets from its tool parser): Kimi K2.5/K2.6 and GLM open
  calls while still thinking, without `</think>`. The call's marker and all
  after it are content, for the tool parser; `left_open` then says that a
  `</think>` may still follow.
- An output that starts with `</think>` closes an empty reasoning: the prompt
  opened `<think>` in a way `prompt_opens_reasoning` could not see.
- Whitespace around the reasoning and at the start of the answer after
  `</think>` is layout and is dropped.

`feed`/`finish` stream `ReasoningDelta` and `ContentDelta` events in order;
`parse_reasoning` is the same run over a whole text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto

from engine.chat.events import ContentDelta, ReasoningDelta, merge_adjacent_deltas
from engine.chat.text_scan import WhitespaceTrimmer, split_at_marker

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

ReasoningEvent = ReasoningDelta | ContentDelta


class _Phase(Enum):
    START = auto()  # leading whitespace, maybe the start of <think>
    REASONING = auto()
    AFTER_CLOSE = auto()  # dropping whitespace after </think>
    ANSWER = auto()  # everything else is content, verbatim


@dataclass(frozen=True)
class ReasoningResult:
    reasoning_content: str | None  # None when the output had no reasoning text
    content: str


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt leaves a `<think>` open for the model to continue."""
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


class ReasoningParser:
    """One per response: `feed` text deltas, then `finish`."""

    def __init__(
        self, starts_in_reasoning: bool = False, tool_call_markers: Sequence[str] = ()
    ) -> None:
        self.starts_in_reasoning = starts_in_reasoning
        self._phase = _Phase.START
        self._buffer = ""
        self._reasoning = WhitespaceTrimmer()
        self._events: list[ReasoningEvent] = []
        self._ends = (THINK_CLOSE, *tool_call_markers)
        self.left_open = False  # reasoning was ended by a tool call, not by </think>

    def end_at_tool_calls(self, markers: Sequence[str]) -> None:
        """Also end reasoning where one of these tool-call markers begins."""
        self._ends = (THINK_CLOSE, *markers)

    def feed(self, delta_text: str) -> list[ReasoningEvent]:
        self._buffer += delta_text
        self._run(final=False)
        return self._take_events()

    def finish(self) -> list[ReasoningEvent]:
        self._run(final=True)
        return self._take_events()

    def _run(self, final: bool) -> None:
        while self._step(final):
            pass

    def _step(self, final: bool) -> bool:
        if self._phase is _Phase.START:
            return self._scan_start(final)
        if self._phase is _Phase.REASONING:
            return self._scan_reasoning(final)
        if self._phase is _Phase.AFTER_CLOSE:
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return False
            self._phase = _Phase.ANSWER
            return True
        if self._buffer:
            self._events.append(ContentDelta(self._buffer))
            self._buffer = ""
        return False

    def _scan_start(self, final: bool) -> bool:
        text = self._buffer.lstrip()
        if text.startswith(THINK_OPEN):
            # Also when the prompt opened <think>: a model may repeat the tag.
            self._buffer = text[len(THINK_OPEN) :]
            self._phase = _Phase.REASONING
            return True
        if text.startswith(THINK_CLOSE):
            self._buffer = text[len(THINK_CLOSE) :]
            self._phase = _Phase.AFTER_CLOSE
            return True
        if not final and (THINK_OPEN.startswith(text) or THINK_CLOSE.startswith(text)):
            return False  # only whitespace, or a partial tag, so far
        # No opening tag: the buffer (leading whitespace and all) is either the
        # continuation of reasoning the prompt opened, or plain content.
        self._phase = _Phase.REASONING if self.starts_in_reasoning else _Phase.ANSWER
        return True

    def _scan_reasoning(self, final: bool) -> bool:
        split = split_at_marker(self._buffer, self._ends, final)
        self._buffer = split.after
        text = self._reasoning.push(split.before)
        if text:
            self._events.append(ReasoningDelta(text))
        if split.marker is None:
            return False
        if split.marker == THINK_CLOSE:
            self._phase = _Phase.AFTER_CLOSE
        else:  # a tool call begins: it, and all after it, is the answer
            self._buffer = split.marker + self._buffer
            self._phase = _Phase.ANSWER
            self.left_open = True
        return True

    def _take_events(self) -> list[ReasoningEvent]:
        events, self._events = self._events, []
        return merge_adjacent_deltas(events)


def parse_reasoning(
    text: str, starts_in_reasoning: bool = False, tool_call_markers: Sequence[str] = ()
) -> ReasoningResult:
    """Split a whole output into reasoning and content."""
    parser = ReasoningParser(starts_in_reasoning, tool_call_markers)
    events = parser.feed(text) + parser.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return ReasoningResult(reasoning_content=reasoning or None, content=content)
