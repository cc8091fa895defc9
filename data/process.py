"""Process-wide settings a run changes for its own duration only, restored after it: headstore runs as a
library inside someone else's process (a notebook, a service), so nothing it does outlives the call.

The command line's own process-wide settings (OMP_WAIT_POLICY, THP_MEM_ALLOC_ENABLE, _RJEM_MALLOC_CONF) are
made in headstore.cli, where it starts, before torch or polars is imported; the library never makes them.
"""
from __future__ import annotations

import contextlib
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
