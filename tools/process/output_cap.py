"""Keep the head and the tail of a stream that may be far too long to keep whole.

Both ends matter: the head says what a command started doing, the tail
holds the error and the exit summary. The middle is counted, not kept.
"""

from __future__ import annotations

import re

# CSI sequences (colours, cursor moves) and OSC sequences (titles, links).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# How far from a cut we look for a line break to cut at instead.
_LINE_SNAP = 256


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class HeadTailBuffer:
    """Holds at most `head_limit` first bytes and `tail_limit` last bytes of what is fed."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > 2 * self.tail_limit:  # trim rarely, not on every chunk
                del self._tail[: len(self._tail) - self.tail_limit]

    @property
    def omitted(self) -> int:
        return max(0, self.total - len(self._head) - min(len(self._tail), self.tail_limit))

    @property
    def truncated(self) -> bool:
        return self.omitted > 0

    def render(self) -> str:
        """The kept text, with a marker saying how much was cut from the middle."""
        head = bytes(self._head)
        tail = bytes(self._tail[-self.tail_limit :]) if self.tail_limit else b""
        if not self.truncated:
            return strip_ansi((head + tail).decode("utf-8", errors="replace"))
        # Cut at line boundaries when one is near, so no half lines are shown.
        cut = head.rfind(b"\n", max(0, len(head) - _LINE_SNAP))
        head_kept = head[: cut + 1] if cut != -1 else head
        start = tail.find(b"\n", 0, _LINE_SNAP)
        tail_kept = tail[start + 1 :] if start != -1 else tail
        omitted = self.total - len(head_kept) - len(tail_kept)
        marker = f"\n[... {omitted:,} bytes omitted from the middle of the output ...]\n"
        text = head_kept.decode("utf-8", errors="replace") + marker
        return strip_ansi(text + tail_kept.decode("utf-8", errors="replace"))
