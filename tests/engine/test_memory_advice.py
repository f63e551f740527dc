"""The packed-weight arena and the advice around a load: pieces that never overlap,
contents that a collapse into huge pages leaves as they were, advice that fails
quietly where the kernel refuses it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from engine.host.memory_advice import (
    ALIGNMENT,
    MappedFile,
    PackedArena,
    advise,
    return_free_memory,
    start_up_finished,
)


@pytest.fixture(autouse=True)
def started(monkeypatch):
    """A start-up already over: the collapses below need not wait (a test that does
    wait gives itself a fresh event)."""
    from engine.host import memory_advice

    monkeypatch.setattr(memory_advice, "_STARTED", threading.Event())
    start_up_finished()


def test_pieces_are_aligned_and_apart_and_survive_the_collapse():
    arena = PackedArena(chunk_bytes=4 << 20)
    pieces = [
        arena.take(n, dtype)
        for n, dtype in [
            (100, torch.uint8),
            (3000, torch.float16),
            (1 << 20, torch.uint8),
            (5 << 20, torch.uint8),
            (7, torch.float16),
        ]
    ]
    spans = sorted((p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()) for p in pieces)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert all(p.data_ptr() % ALIGNMENT == 0 for p in pieces)
    for index, piece in enumerate(pieces):
        piece.view(torch.uint8).fill_(index + 1)
    arena.collapse_in_background().join(timeout=60)
    for index, piece in enumerate(pieces):
        assert bool((piece.view(torch.uint8) == index + 1).all())


def test_a_dropped_arena_piece_frees_its_chunk_after_the_collapse():
    arena = PackedArena(chunk_bytes=2 << 20)
    piece = arena.take(1024, torch.uint8)
    thread = arena.collapse_in_background()
    del piece
    thread.join(timeout=60)
    assert arena._chunks == [] and arena._chunk is None  # nothing kept past the thread


def test_file_advice_leaves_the_bytes_readable(tmp_path):
    path = tmp_path / "blob"
    data = np.arange(3 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    advice = MappedFile(mapped)
    rows = mapped.reshape(-1, 4096)
    advice.populate(rows, 5, 300)
    assert np.array_equal(rows[5], data.reshape(-1, 4096)[5])
    advice.release()  # pages dropped from this process, still the file's
    assert np.array_equal(np.asarray(mapped), data)


def test_refused_advice_is_only_a_false():
    assert advise(0, 10, 4) is False  # less than a whole page
    assert advise(4096, 4096, 12345) is False  # no such advice
    return_free_memory()


def test_the_collapse_waits_until_start_up_is_finished(monkeypatch):
    """Beside start-up's own work the collapse slowed it; it begins once the process
    says start-up is over (or after a bound, for embedders that never say)."""
    from engine.host import memory_advice

    monkeypatch.setattr(memory_advice, "_STARTED", threading.Event())
    monkeypatch.setattr(memory_advice, "_START_WAIT_S", 60.0)
    arena = PackedArena(chunk_bytes=2 << 20)
    arena.take(1024, torch.uint8).fill_(3)
    thread = arena.collapse_in_background()
    thread.join(timeout=0.3)
    assert thread.is_alive()  # still waiting
    memory_advice.start_up_finished()
    thread.join(timeout=60)
    assert not thread.is_alive()


class _Calls(list):
    """When the collapse advised; `quiet`: whether no step was running then."""

    def __init__(self):
        super().__init__()
        self.quiet: list[bool] = []


def _collapse_calls(monkeypatch) -> _Calls:
    """Record when the collapse thread advises, instead of advising."""
    from engine.host import memory_advice

    calls = _Calls()
    advise_now = memory_advice.advise

    def advise(address: int, length: int, advice: int) -> bool:
        if advice != memory_advice.MADV_COLLAPSE:
            return advise_now(address, length, advice)
        calls.append(time.monotonic())
        calls.quiet.append(memory_advice._step_began <= memory_advice._step_ended)
        return True

    monkeypatch.setattr(memory_advice, "advise", advise)
    return calls


def test_the_collapse_waits_for_a_step_to_end(monkeypatch):
    from engine.host import memory_advice

    monkeypatch.setattr(memory_advice, "_PATIENCE_S", 30.0)
    calls = _collapse_calls(monkeypatch)
    arena = PackedArena(chunk_bytes=4 << 20)
    arena.take(1 << 20, torch.uint8)
    with memory_advice.step_running():
        thread = arena.collapse_in_background()
        time.sleep(0.6)  # a long step: quiet time passes, but the step is still running
        assert calls == []
    ended = time.monotonic()
    thread.join(timeout=10)
    assert len(calls) == 1 and calls[0] >= ended + memory_advice._QUIET_S


def test_steady_steps_still_let_the_collapse_through(monkeypatch):
    from engine.host import memory_advice

    monkeypatch.setattr(memory_advice, "_PATIENCE_S", 0.3)
    monkeypatch.setattr(memory_advice, "_PIECE", 2 << 20)
    calls = _collapse_calls(monkeypatch)
    arena = PackedArena(chunk_bytes=8 << 20)
    arena.take(7 << 20, torch.uint8)
    thread = arena.collapse_in_background()
    began = time.monotonic()
    while thread.is_alive() and time.monotonic() - began < 10:
        with memory_advice.step_running():  # back-to-back steps, never a quiet span
            time.sleep(0.01)
    assert len(calls) == 4  # 8 MiB in 2 MiB pieces: patience spent, then one after another
    assert calls[0] - began >= 0.25
    assert calls.quiet.count(False) >= 3  # went beside running steps, not waiting for quiet


def test_pages_settle_once_every_collapse_is_done(monkeypatch):
    from engine.host import memory_advice

    monkeypatch.setattr(memory_advice, "_COLLAPSES", [])
    calls = _collapse_calls(monkeypatch)
    arena = PackedArena(chunk_bytes=2 << 20)
    arena.take(1024, torch.uint8)
    with memory_advice.step_running():  # the collapse waits while a step runs
        thread = arena.collapse_in_background()
        assert not memory_advice.pages_settled(timeout=0.1) and thread.is_alive()
    assert memory_advice.pages_settled(timeout=10) and len(calls) == 1
