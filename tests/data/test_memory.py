"""data.memory.trim_heap gives freed heap pages back to the OS (glibc), and is a no-op elsewhere."""
import ctypes.util
import sys

import pytest

from headstore.data.memory import trim_heap


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"), reason="glibc only")
def test_freed_heap_pages_go_back_to_the_os():
    blocks = [bytearray(100_000) for _ in range(3000)]  # 300 MB of heap chunks (below glibc's mmap threshold)
    pin = bytearray(100_000)  # a live chunk above them: the heap cannot shrink from its top by itself
    del blocks
    before = _rss_mb()
    assert trim_heap() is True
    after = _rss_mb()
    assert before - after > 150, (before, after)
    del pin


def test_cli_asks_torch_for_huge_pages_unless_the_environment_says_otherwise():
    """The command line (`import headstore.cli`) sets THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator: transparent huge pages for large
    blocks) before torch is imported, and leaves a value the user set."""
    import os
    import subprocess

    code = "import os, headstore.cli; print(os.environ['THP_MEM_ALLOC_ENABLE'])"
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "1"
    env["THP_MEM_ALLOC_ENABLE"] = "0"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "0"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_cli_makes_polars_give_freed_pages_back_unless_the_environment_says_otherwise():
    """The command line (`import headstore.cli`) sets _RJEM_MALLOC_CONF (polars' jemalloc) so a freed polars buffer leaves the process at
    once; a value the user set is kept (here one that keeps freed pages: the memory stays)."""
    import os
    import subprocess

    code = ("import headstore.cli, polars as pl\n"
            "def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20\n"
            "base = rss(); s = pl.int_range(0, 40_000_000, eager=True) * 2; big = rss(); del s\n"
            "print(big - base, rss() - base)")  # ~300 MB of int64 buffers, then freed
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    grown, kept = map(float, subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                            check=True).stdout.split())
    assert grown > 250 and kept < 50, (grown, kept)
    env["_RJEM_MALLOC_CONF"] = "dirty_decay_ms:60000,muzzy_decay_ms:60000"
    grown, kept = map(float, subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                            check=True).stdout.split())
    assert grown > 250 and kept > 250, (grown, kept)
