"""Output pacing: a streamed request's new tokens held for a few milliseconds and sent as one.

Why: whoever consumes a stream (the server's event loop writing an SSE event
to a socket, the TUI redrawing a message) wakes once per delivery. Delivering
every decode step means a wake-up every few milliseconds, and on a machine
whose cores all run the engine's compute team (2 cores, 2 OpenMP threads)
each one takes a core from the team and stalls it at its next barrier: a
socket send and the client's read cost about as much as a tenth of a small
model's step. Held for at most `interval` seconds and merged (one output with
the deltas of several steps), a stream wakes its consumer about 1/interval
times a second, whatever the step rate. Nothing waits that a reader would
notice: a request's first output (time to first token), its last one and its
errors are never held, and a slow model's steps, each longer than the
interval, go out one by one as before.

The pacer lives on the engine thread and is not thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.requests.outputs import RequestOutput


def merge_outputs(earlier: RequestOutput, later: RequestOutput) -> RequestOutput:
    """`later` carrying the deltas of both: as if the two steps had been one.

    Everything else in an output is cumulative (text, token ids, logprobs), so
    the later one already holds it."""
    for older, newer in zip(earlier.outputs, later.outputs, strict=False):
        newer.delta_text = older.delta_text + newer.delta_text
        newer.delta_token_ids = older.delta_token_ids + newer.delta_token_ids
    if later.prompt_logprobs is None:
        later.prompt_logprobs = earlier.prompt_logprobs
    return later


def _is_first(output: RequestOutput) -> bool:
    """Nothing of this request has been delivered before (its time to first token)."""
    return all(len(c.delta_token_ids) == len(c.token_ids) for c in output.outputs)


class OutputPacer:
    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._held: dict[str, RequestOutput] = {}
        self._oldest: float | None = None  # when the longest-held output arrived
        self.last_step = 0.0  # seconds the engine's last step took: the next one's estimate

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def admit(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """A step's outputs in; what to deliver now out (empty while all are held).

        Whenever something must go now (a first or last output), everything held
        goes with it: the consumer wakes anyway."""
        if not outputs:
            return []
        now = self.clock()
        urgent = self.interval <= 0
        for output in outputs:
            held = self._held.pop(output.request_id, None)
            if held is not None:
                output = merge_outputs(held, output)
            self._held[output.request_id] = output
            urgent = urgent or output.finished or _is_first(output)
        if self._oldest is None:
            self._oldest = now
        if urgent or self.due(now):
            return self.take()
        return []

    def due(self, now: float | None = None) -> bool:
        """Whether holding through one more step (as long as the last) would keep an
        output past the interval: then it goes before that step."""
        if self._oldest is None:
            return False
        now = self.clock() if now is None else now
        return now - self._oldest + self.last_step >= self.interval

    def take(self) -> list[RequestOutput]:
        """Everything held, oldest request first; the pacer is empty after."""
        outputs = list(self._held.values())
        self._held.clear()
        self._oldest = None
        return outputs
