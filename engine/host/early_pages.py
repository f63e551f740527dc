"""A GGUF model's packed-weight memory made resident while the server is still importing.

A server's first second or more goes to importing torch, on one core. Making the
packed weights' pages resident (zeroed and mapped: 0.6-0.8 s a GiB on the 2-core VMs
measured, the largest single cost of packing a GGUF file) needs neither torch nor the
GIL, so `prepare` starts it on the other core from the CLI, before those imports: one
anonymous region about the file's size, written a page at a time front to back by a
daemon thread, and the file itself read ahead by the kernel
(posix_fadvise WILLNEED: a cold page cache fills while Python imports). The loader's
PackedArena then takes its pieces from the region in order (`take`), and once the
packing is done `finish` gives back whatever the load did not take, so the process
ends up holding what it held before, only sooner. Not for `LLM(file)`: torch is
imported by then, and a region started beside the model's build was still being
written when the packing began, which then waited on it (Kimi-shaped 2B: 0.1 s
slower, not faster).

Nothing here imports torch (the module runs before it) and every call is advice: where
the kernel refuses it the region is still plain zeroed memory, faulted on first write.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading

import numpy as np

from engine.host.madvise import (
    ALIGNMENT,
    HUGE_PAGE,
    LIBC,
    MADV_DONTNEED,
    MADV_POPULATE_WRITE,
    advise,
)

# The populating thread's piece: between pieces it takes the GIL back for a moment (the
# importing thread holds it), so not small; a `take` reaching the piece being written
# waits for it, so not large either.
_PIECE = 32 << 20
log = logging.getLogger(__name__)


def _page_up(offset: int) -> int:
    return -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE


class _Region:
    """One anonymous mapping, handed out front to back from a huge-page boundary.

    The populating thread writes a zero to each page, so it must never reach a page the
    loader has written: it only takes pieces past what has been handed out (`used`), and
    a `take` that would hand out part of the piece being written waits for it."""

    def __init__(self, nbytes: int):
        # Private: Python's default for an anonymous map is shared memory (shmem), which
        # MADV_DONTNEED would only unmap, not free, and which collapses into huge pages
        # only where shmem THP is enabled.
        self.map = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
        self.view = memoryview(self.map)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.first = -self.address % HUGE_PAGE  # whole huge pages, for the later collapse
        self.end = self.first + nbytes
        self.cond = threading.Condition()  # guards what follows
        self.used = self.first  # handed out below this offset
        self.populated = self.first  # resident below this offset
        self.writing: tuple[int, int] | None = None  # the thread's piece now
        self.stopped = False
        self.thread = threading.Thread(
            target=self._populate, name="resident-early-pages", daemon=True
        )
        self.thread.start()

    def _populate(self) -> None:
        # A write to each page, from numpy (which lets go of the GIL for the loop): each
        # fault takes only its mapping's own lock (Linux 6.4's per-VMA locks), where one
        # MADV_POPULATE_WRITE call holds the process's mmap lock throughout and stalls
        # the importing thread's every mmap: torch's import took 0.35 s longer beside it.
        pages = np.frombuffer(self.map, dtype=np.uint8)
        while True:
            with self.cond:
                start = max(self.populated, _page_up(self.used))
                if self.stopped or start >= self.end:
                    return
                stop = min(start + _PIECE, self.end)
                self.writing = (start, stop)
            pages[start : stop : mmap.PAGESIZE] = 0  # no one holds these pages yet
            with self.cond:
                self.writing = None
                self.populated = stop
                self.cond.notify_all()

    def hand_out(self, nbytes: int) -> tuple[int, bool] | None:
        """The next piece's offset and whether its pages may not all be resident yet; None
        once closed or when it does not fit (which closes the region)."""
        with self.cond:
            while not self.stopped:
                start = -(-self.used // ALIGNMENT) * ALIGNMENT
                stop = start + nbytes
                if stop > self.end:
                    break  # closes the region, below (the thread stops first)
                if self.writing is not None and self.writing[0] < stop:
                    self.cond.wait()  # the thread's piece: its zeros must land first
                    continue
                self.used = stop
                return start, stop > self.populated
            if self.stopped:
                return None
        self.close()
        return None

    def close(self) -> None:
        """No more pieces: stop populating and give back the pages past the last one."""
        with self.cond:
            if self.stopped:
                return
            self.stopped = True
        self.thread.join()  # so no write lands after the DONTNEED below
        kept = _page_up(self.used)
        advise(self.address + kept, self.end - kept, MADV_DONTNEED)
        log.debug(
            "early pages: %d of %d MiB taken",
            (self.used - self.first) >> 20,
            (self.end - self.first) >> 20,
        )


_LOCK = threading.Lock()
_REGION: _Region | None = None


def packs_here(model: str, device: str | None, ranks: int) -> bool:
    """Whether a process loading `model` will pack a GGUF file's weights itself for the
    CPU kernels: a .gguf path, one rank, and the CPU (asked for, or no NVIDIA device to
    default to). A wrong guess costs only the memory made early, given back at the load's
    end."""
    cpu = device == "cpu" or (device is None and not os.path.exists("/dev/nvidiactl"))
    return cpu and ranks == 1 and str(model).endswith(".gguf")


def prepare(path: str | os.PathLike, nbytes: int | None = None) -> bool:
    """For a GGUF file about to be loaded by this process: read it ahead and start making
    a region of its size (or `nbytes`) resident. Whether a region was started (one at a
    time; none for anything but a readable .gguf file, or off Linux)."""
    global _REGION
    path = os.fspath(path)
    if LIBC is None or not path.endswith(".gguf") or not os.path.isfile(path):
        return False
    try:
        size = os.path.getsize(path) if nbytes is None else nbytes
        with open(path, "rb") as file:
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
    except (OSError, AttributeError):
        return False
    with _LOCK:
        if _REGION is not None:
            return False
        try:
            _REGION = _Region(-(-size // mmap.PAGESIZE) * mmap.PAGESIZE)
        except (OSError, ValueError):  # no memory to map: the loader allocates as it goes
            return False
    return True


def take(nbytes: int) -> memoryview | None:
    """The next `nbytes` of the region (64-byte aligned, zeroed, resident), or None when
    no region is open or it has no room left. The first piece that does not fit closes
    it: its populated tail goes back at once, before the loader's own memory for the
    rest adds to the peak (the packed forms run ~2% past the file's bytes)."""
    region = _REGION
    placed = region.hand_out(nbytes) if region is not None else None
    if placed is None:
        return None
    start, ahead = placed
    if ahead:  # the load outran the thread: this piece's pages in one call, not a fault each
        advise(region.address + start, nbytes, MADV_POPULATE_WRITE)
    return region.view[start : start + nbytes]


def finish() -> memoryview | None:
    """Close the region (if the load has not filled it) and return the part handed out
    (whole huge pages from its start, for the collapse), or None when there was none."""
    global _REGION
    with _LOCK:
        region, _REGION = _REGION, None
        if region is None:
            return None
        region.close()
    if region.used == region.first:
        return None
    return region.view[region.first : region.used]
