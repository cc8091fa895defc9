"""Giving freed memory back to the operating system between phases of long work."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS (glibc's malloc_trim(0), as Dask's workers do). After a phase
    that allocated and freed many large transients (training's blocks of a 1M-document corpus), glibc keeps
    ~0.3 GB of freed pages in the process, which then count in the next phase's peak RSS. Returns False where
    the C library has no malloc_trim (macOS, musl): nothing to do there."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim(0)
    return True
