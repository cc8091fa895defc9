"""Process-wide settings a run changes for its own duration only, restored after it: headstore runs as a
library inside someone else's process (a notebook, a service), so nothing it does outlives the call.

The command line's own process-wide settings (OMP_WAIT_POLICY, THP_MEM_ALLOC_ENABLE, _RJEM_MALLOC_CONF, and for
`cli grid` `keep_freed_memory`) are made in headstore.cli, where it starts, before torch or polars is imported;
the library never makes them.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from typing import Iterator, Mapping


@contextlib.contextmanager
def scoped_environ(defaults: Mapping[str, str]) -> Iterator[None]:
    """`defaults` in os.environ for the block where the environment does not set them; restored after."""
    added = [k for k in defaults if k not in os.environ]
    for key in added:
        os.environ[key] = defaults[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` for the block (None: left as it is), restored after."""
    if n is None:
        yield
        return
    import torch  # here: this layer imports torch only where a run asks for threads

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# glibc malloc's knobs (mallopt's parameter numbers). A user who set any of glibc's malloc variables (MALLOC_*,
# GLIBC_TUNABLES) keeps their allocator as they set it.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30  # blocks up to 1 GiB come from the heap, and up to 1 GiB freed stays in it


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory this process frees for its next allocations, instead of handing each
    large block back to the kernel and faulting fresh zeroed pages in for the next: a head's training step
    allocates the same few megabyte-sized tensors (autocast's casts, gradients) every step. Process-wide and for
    good, so the command line's alone (headstore.cli). True when set; False, nothing changed, where the C library
    is not glibc or the environment sets malloc's own variables."""
    if any(key.startswith("MALLOC_") or key == "GLIBC_TUNABLES" for key in os.environ):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt  # glibc only (not macOS' or musl's C library)
    except (OSError, AttributeError):
        return False
    # both: either alone turns glibc's sliding thresholds off, which is slower than the default (musl's stub: 0)
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES))
