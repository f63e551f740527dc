"""Telling Linux how a model's bytes will be used, so a large load stays fast and small.

- Packed weights are about a file's size and are written once, then streamed on every
  decode step: `PackedArena` hands them out of large chunks advised as huge pages,
  so writing a gigabyte takes hundreds of page faults rather than hundreds of
  thousands, and decode walks them with fewer TLB misses.
- A mapped GGUF file is read once at load: `MappedFile` populates a range's page
  tables in one call before it is read and drops the pages once their blocks are
  packed, so the file's bytes and their packed copy are not both resident.

Advice is only advice: where the kernel refuses it (another OS, an old kernel, THP
off) the calls fail quietly and everything still works, only slower or larger.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import torch

HUGE_PAGE = 2 << 20
MADV_DONTNEED = 4
MADV_HUGEPAGE = 14
MADV_POPULATE_READ = 22  # Linux 5.14
ALIGNMENT = 64  # bytes: every piece starts on a cache line, as torch's allocator gives
_CHUNK = 256 << 20


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def advise(address: int, length: int, advice: int) -> bool:
    """madvise on the whole pages inside [address, address + length); whether it took."""
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + length) // mmap.PAGESIZE * mmap.PAGESIZE
    if _LIBC is None or end <= start:
        return False
    return _LIBC.madvise(start, end - start, advice) == 0


class PackedArena:
    """Flat tensors carved from chunks of huge-page-advised memory, never freed apart
    (a model's packed weights live as long as the model)."""

    def __init__(self, chunk_bytes: int = _CHUNK):
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0

    def take(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """`count` elements of `dtype`, uninitialised, 64-byte aligned."""
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        start = -(-self._used // ALIGNMENT) * ALIGNMENT
        if self._chunk is None or start + nbytes > self._chunk.numel():
            self._chunk = self._new_chunk(max(nbytes, self.chunk_bytes))
            start = 0
        self._used = start + nbytes
        return self._chunk[start : start + nbytes].view(dtype)

    @staticmethod
    def _new_chunk(nbytes: int) -> torch.Tensor:
        raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
        offset = -raw.data_ptr() % HUGE_PAGE
        chunk = raw[offset : offset + nbytes]
        advise(chunk.data_ptr(), nbytes, MADV_HUGEPAGE)
        return chunk


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

    def release(self) -> None:
        """Drop every page of the file from this process (they stay in the page cache)."""
        advise(self.address, self.length, MADV_DONTNEED)


def return_free_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim): a load frees
    gigabytes of float copies and temporaries in pieces the allocator would keep."""
    trim = getattr(_LIBC, "malloc_trim", None) if _LIBC is not None else None
    if trim is not None:
        trim(0)
