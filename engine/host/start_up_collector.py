"""Python's cyclic garbage collector held off while an engine starts.

What an engine's start makes lives as long as the engine: a server process tracks
230-285 thousand objects once torch, the server's modules and a model are in. CPython
runs a full collection whenever the objects that outlived the younger generations have
grown by a quarter, and a full collection walks every tracked object: 110-180 ms each
on a 2-core Zen 4 VM, several of them during a start that leaves almost nothing to
collect (a server started on a 0.85B Llama or a 2B Kimi-shaped GGUF file left 10 to
7,197 unreachable objects, under 1 MiB, and collecting them gave back no resident
page). Held off, a later start of `python -m engine serve` on the 0.85B Llama GGUF file
reached its first token 2.24 -> 1.78 s (`resident bench families --families llama
--figures load`) at the same peak memory.

- `held()`: no automatic collection while an engine is built, by any caller (LLM,
  AsyncEngine, the agent's local engine); the collector is as it was afterwards.
- A server owns its process, so it holds them from its command's start, before torch's
  import (`hold`), and when it is about to serve, `release(freeze=True)` moves what
  start-up made into the permanent generation (gc.freeze), which no later collection
  walks: without that, the first full collection while serving stalls a step for as
  long as one at start-up did.

A library never freezes: the objects would be its caller's as well as its own.
Nothing here imports torch (a server calls `hold` before that import).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_held = False  # whether `hold` turned the collector off (so `release` turns it back on)


def hold() -> None:
    """Stop automatic collections until `release` (a no-op if the caller already has)."""
    global _held
    if gc.isenabled():
        gc.disable()
        _held = True


def release(freeze: bool) -> None:
    """Undo `hold`; with `freeze`, first move every object alive now to the permanent
    generation (only for a process this code owns: a server)."""
    global _held
    if not _held:
        return
    _held = False
    if freeze:
        gc.freeze()
    gc.enable()


@contextmanager
def held() -> Iterator[None]:
    """No automatic collection inside; the collector as it was afterwards, also on error."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
