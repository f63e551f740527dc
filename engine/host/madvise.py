"""madvise from Python (ctypes, no torch): the advice the loader and the packed-weight
arena give Linux about their memory, and the constants they give it with. Every call
is advice: where the kernel refuses it (another OS, an old kernel, THP off) it returns
False and the caller goes on."""

from __future__ import annotations

import ctypes
import mmap
import sys

HUGE_PAGE = 2 << 20
MADV_DONTNEED = 4
MADV_HUGEPAGE = 14
MADV_POPULATE_READ = 22  # Linux 5.14
MADV_POPULATE_WRITE = 23  # Linux 5.14
MADV_COLLAPSE = 25  # Linux 6.1
ALIGNMENT = 64  # bytes: every piece starts on a cache line, as torch's allocator gives


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


LIBC = _libc()


def advise(address: int, length: int, advice: int) -> bool:
    """madvise on the whole pages inside [address, address + length); whether it took."""
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + length) // mmap.PAGESIZE * mmap.PAGESIZE
    if LIBC is None or end <= start:
        return False
    return LIBC.madvise(start, end - start, advice) == 0
