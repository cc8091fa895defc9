"""headstore: featurize texts once with a frozen encoder, train many small energy heads on the features.

The repository's top-level folders are this package's sub-packages (``headstore.data`` <- ``data/``,
``headstore.featurize`` <- ``featurize/``, ``headstore.heads`` <- ``heads/``, ``headstore.cli`` <-
``cli.py``); see ``pyproject.toml``.

Importing headstore sets OMP_WAIT_POLICY=PASSIVE (unless the environment already sets it) for the
OpenMP runtime torch loads on first import: OpenMP threads that reach a barrier then sleep instead of
spinning. On a CPU shared with other busy processes, spinning waiters keep the one thread that still
has work off its core, and every op of a forward pass stalls for a time slice; measured on a 2-core
machine at load ~4, MiniLM forwards were 1.7-25x faster with PASSIVE (the smaller the batch, the
larger the gain). It only takes effect when nothing imported torch before; the numbers computed are
unchanged (the same threads split the same work).

It also sets THP_MEM_ALLOC_ENABLE=1 (unless set): torch's CPU allocator then asks the kernel for transparent
huge pages (madvise) for blocks of 2 MB and more. A stack of 64 heads allocates and frees gigabytes of
50-170 MB blocks each epoch (activations, re-mining and dev-ranking blocks), each mapped fresh and faulted in
page by page; with 2 MB pages a 64-head grid over 100k documents spent 127 s instead of 239 s in the kernel
and trained 15% faster (3 epochs: 310 s vs 367 s), peak RSS 5.7 vs 5.5 GB, the same numbers. (Keeping freed
blocks in the C heap instead, glibc's mallopt thresholds at 1 GB, saved more time but took 14.7 GB.) Where the kernel
offers no transparent huge pages, the setting changes nothing.

And it sets _RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 (unless set), read by the jemalloc polars is built
with: pages polars frees go back to the OS at once instead of waiting for polars' next allocations to age them out.
Reading a BEIR folder of 1M documents left ~140 MB of freed polars pages in the process (547 vs 690 MB after the
load, the same 6.0 s), through training and evaluation, where they counted in the peak RSS; 3x that at 3M. Only
where polars was not imported before headstore.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")

__version__ = "0.2.0"

# The public API, imported on first use so that `import headstore.cli` (and the OMP setting above,
# which must precede torch's import) stays cheap: headstore.Store, headstore.Head, headstore.Pipeline.
_API = {
    "Store": "headstore.featurize.store_api",
    "Head": "headstore.heads.head",
    "Pipeline": "headstore.heads.apply.pipeline",
}
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'headstore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
