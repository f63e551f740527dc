"""Telling Linux how a model's bytes will be used, so a large load stays fast and small.

- Packed weights are about a file's size and are written once, then streamed on every
  decode step: `PackedArena` hands them out of large chunks, which a background
  thread then collapses into huge pages (MADV_COLLAPSE, Linux 6.1). Decode walks
  them with fewer TLB misses: the Kimi-shaped 2B MoE decoded one stream at 56
  tok/s instead of 49 on 2 cores. Faulting them in as huge pages directly (advice
  before writing) took 3 s a GiB at every load on the 2-core VMs measured, in the
  load's path: their free huge blocks go back to the hypervisor (free page
  reporting) and each is backed afresh on first touch, where 4 KiB faults reuse warm
  pages (0.44 s a GiB; huge ones 0.09 s where the blocks are warm). The collapse
  costs the same 3 s there, but after start-up instead of in it: it waits for the
  process to say its start-up is over (`start_up_finished`: a server about to serve,
  a library's LLM built), since beside start-up's own work it made a 2B Kimi-shaped
  server answer its first request 0.8 s later (2 cores). It then works in pieces of
  32 MiB while no step runs (`step_running`, around every step of every rank): beside
  a step it takes a core from the kernels' threads, and a 0.85B Llama answered its
  first request 0.6 s later with it. Its patience is 1 s in all: past that the
  engine is under steady load, and the pieces go through back to back, since spread
  thin (a piece every 0.5 s) they kept a busy GLM-shaped server 15% slower for the
  16 s they took.
- A mapped GGUF file is read once at load: `MappedFile` populates a range's page
  tables in one call before it is read and drops the pages once their blocks are
  packed, so the file's bytes and their packed copy are not both resident.

Advice is only advice: where the kernel refuses it (another OS, an old kernel, THP
off) the calls fail quietly and everything still works, only slower or larger.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from engine.host import early_pages
from engine.host.madvise import (
    ALIGNMENT,
    HUGE_PAGE,
    LIBC,
    MADV_COLLAPSE,
    MADV_DONTNEED,
    MADV_POPULATE_READ,
    MADV_POPULATE_WRITE,
    advise,
)

_CHUNK = 256 << 20
# Set once the process's start-up is over; deferred background work waits for it, or at
# most _START_WAIT_S, so an embedder that never says still gets it.
_STARTED = threading.Event()
_START_WAIT_S = 5.0
_PIECE = 32 << 20  # bytes a collapse call takes: about 0.1 s where blocks are cold
_QUIET_S = 0.25  # no step for this long: the engine is idle
_PATIENCE_S = 1.0  # the most the collapse waits for quiet moments, in all
_COLLAPSES: list[threading.Thread] = []  # started collapse threads, for `pages_settled`
# time.monotonic() when the latest step began and ended (start-up's end counts as one)
_step_began = _step_ended = 0.0
log = logging.getLogger(__name__)


class PackedArena:
    """Flat tensors carved from chunks of huge-page-advised memory, never freed apart
    (a model's packed weights live as long as the model)."""

    def __init__(self, chunk_bytes: int = _CHUNK):
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0
        self._chunks: list[torch.Tensor] = []

    def take(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """`count` elements of `dtype`, uninitialised, 64-byte aligned: from the region
        made resident while the process started (engine/host/early_pages.py) while it
        has room, else from this arena's chunks."""
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        early = early_pages.take(nbytes) if nbytes else None
        if early is not None:
            return torch.frombuffer(early, dtype=torch.uint8).view(dtype)
        start = -(-self._used // ALIGNMENT) * ALIGNMENT
        if self._chunk is None or start + nbytes > self._chunk.numel():
            self._chunk = self._new_chunk(max(nbytes, self.chunk_bytes))
            self._chunks.append(self._chunk)
            start = 0
        self._used = start + nbytes
        taken = self._chunk[start : start + nbytes]
        # Its pages made in one call, not one fault per page as the packer writes them.
        advise(taken.data_ptr(), nbytes, MADV_POPULATE_WRITE)
        return taken.view(dtype)

    @staticmethod
    def _new_chunk(nbytes: int) -> torch.Tensor:
        raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
        offset = -raw.data_ptr() % HUGE_PAGE  # whole huge pages, for the collapse
        return raw[offset : offset + nbytes]

    def end_early_region(self) -> None:
        """The packing is done: the start-up region gives back what was not taken, and
        what was joins this arena's chunks for the collapse."""
        taken = early_pages.finish()
        if taken is not None:
            self._chunks.append(torch.frombuffer(taken, dtype=torch.uint8))

    def collapse_in_background(self) -> threading.Thread:
        """Collapse the chunks written so far into huge pages from a daemon thread (the
        GIL is released in madvise), once start-up is over (`start_up_finished`). The
        thread lets go of each chunk once it is done with it: a model dropped meanwhile
        is freed a few seconds late at most."""
        chunks, self._chunks, self._chunk = self._chunks, [], None

        def collapse() -> None:
            _STARTED.wait(_START_WAIT_S)
            start, done, total = time.perf_counter(), 0, 0
            patience = _PATIENCE_S
            while chunks:
                chunk = chunks.pop(0)
                for offset in range(0, chunk.numel(), _PIECE):
                    patience -= _wait_between_steps(patience)
                    size = min(_PIECE, chunk.numel() - offset)
                    done += advise(chunk.data_ptr() + offset, size, MADV_COLLAPSE)
                    total += 1
                del chunk
            log.debug(
                "packed weights: %d of %d pieces in huge pages after %.1f s",
                done,
                total,
                time.perf_counter() - start,
            )

        thread = threading.Thread(target=collapse, name="resident-huge-pages", daemon=True)
        thread.start()
        _COLLAPSES[:] = [*(t for t in _COLLAPSES if t.is_alive()), thread]
        return thread


def start_up_finished() -> None:
    """Say this process has finished starting: background work deferred until then (the
    packed weights' collapse into huge pages) begins now, between steps."""
    global _step_ended
    _step_ended = time.monotonic()  # a server's first request comes at once: leave it room
    _STARTED.set()


def pages_settled(timeout: float = 60.0) -> bool:
    """Wait until every packed-weight collapse has finished (at most `timeout` seconds);
    whether they all have. For measuring steady decode speed, not start-up's."""
    deadline = time.monotonic() + timeout
    for thread in list(_COLLAPSES):
        thread.join(max(0.0, deadline - time.monotonic()))
    _COLLAPSES[:] = [thread for thread in _COLLAPSES if thread.is_alive()]
    return not _COLLAPSES


@contextmanager
def step_running() -> Iterator[None]:
    """Around a forward step: deferred background work keeps out of its way. Steps of
    one process never overlap (one engine thread), so two stamps say it all."""
    global _step_began, _step_ended
    _step_began = time.monotonic()
    try:
        yield
    finally:
        _step_ended = time.monotonic()


def _wait_between_steps(patience: float) -> float:
    """Wait until no step has run for _QUIET_S, or `patience` seconds at most; the
    seconds waited."""
    began = time.monotonic()
    while (now := time.monotonic()) - began < patience:
        if _step_began <= _step_ended and now - _step_ended >= _QUIET_S:
            break
        time.sleep(_QUIET_S / 5)
    return time.monotonic() - began


class MappedFile:
    """The advice for one memory-mapped file (a numpy memmap of it)."""

    def __init__(self, mapped: np.ndarray):
        self.address = mapped.ctypes.data
        self.length = mapped.nbytes

    def populate(self, view: np.ndarray, first_row: int, last_row: int) -> None:
        """Page tables for rows first_row..last_row of `view` (a row view into the file)."""
        start = view.ctypes.data + first_row * view.strides[0]
        length = (last_row - first_row + 1) * view.strides[0]
        # Widened to whole pages outward: populating is harmless past the rows.
        page = mmap.PAGESIZE
        aligned = start // page * page
        advise(aligned, -(-(start + length - aligned) // page) * page, MADV_POPULATE_READ)

    def release_rows(self, view: np.ndarray, first_row: int, last_row: int) -> None:
        """Drop the pages of rows first_row..last_row of `view` from this process, once
        they are packed (a page a neighbouring piece shares is read again if needed)."""
        start = view.ctypes.data + first_row * view.strides[0]
        length = (last_row - first_row + 1) * view.strides[0]
        page = mmap.PAGESIZE
        aligned = start // page * page
        advise(aligned, -(-(start + length - aligned) // page) * page, MADV_DONTNEED)

    def release(self) -> None:
        """Drop every page of the file from this process (they stay in the page cache)."""
        advise(self.address, self.length, MADV_DONTNEED)


def return_free_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim): a load frees
    gigabytes of float copies and temporaries in pieces the allocator would keep."""
    trim = getattr(LIBC, "malloc_trim", None) if LIBC is not None else None
    if trim is not None:
        trim(0)
