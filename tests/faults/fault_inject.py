"""Test-only fault injection at headstore's write sites (nothing here is imported by headstore itself).

A fault is `SITE:WHAT:NTH`: at the NTH call of SITE (1-based) the call fails with WHAT, an errno name
(ENOSPC, EDQUOT, EIO, EROFS, ENOENT: raised as the OS would, without a file name) or a signal (SIGINT,
SIGKILL: sent to this process before the call goes on). WHAT `count` only counts the calls. Sites:
  atomic   data.files._publish: every artefact's fsync + rename (manifests, metrics, heads, configs)
  parquet  polars' DataFrame.write_parquet: texts parts, results.parquet, index items (polars reports an
           OS error as its own ComputeError "... (os error N)")
  zarr     zarr's local store write of one file (a feature shard or an array's zarr.json)
  fsync    os.fsync (the durability step of every commit; EIO is how a failing disk shows there)
A child process (tests/faults/fault_child.py) and a test in this process both use `injected`.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
from dataclasses import dataclass, field

SITES = ("atomic", "parquet", "zarr", "fsync")
ERRNOS = ("ENOSPC", "EDQUOT", "EIO", "EROFS", "ENOENT")
SIGNALS = ("SIGINT", "SIGKILL")


@dataclass
class Fault:
    site: str
    what: str = "count"
    nth: int = 1
    calls: dict = field(default_factory=dict)  # site -> calls seen (every site is counted)
    fired: bool = False

    @classmethod
    def parse(cls, spec: str) -> "Fault":
        site, what, nth = (spec.split(":") + ["count", "1"])[:3]
        assert site in SITES and (what in ERRNOS or what in SIGNALS or what == "count"), spec
        return cls(site, what, int(nth))

    def spec(self) -> str:
        return f"{self.site}:{self.what}:{self.nth}"

    def hit(self, site: str) -> None:
        """Count a call of `site`; fail it when it is the chosen one."""
        self.calls[site] = self.calls.get(site, 0) + 1
        if site != self.site or self.what == "count" or self.calls[site] != self.nth:
            return
        self.fired = True
        if self.what in SIGNALS:
            os.kill(os.getpid(), getattr(signal, self.what))
            return
        code = getattr(errno, self.what)
        raise OSError(code, os.strerror(code))


def _polars_error(err: OSError) -> Exception:
    from polars.exceptions import ComputeError

    return ComputeError(f"parquet: File out of specification: underlying IO error: {err.strerror} "
                        f"(os error {err.errno})")


@contextlib.contextmanager
def injected(fault: Fault):
    """Patch every site for the block (calls are counted in fault.calls)."""
    import polars as pl
    import zarr.storage._local as zarr_local

    import headstore.data.files as files

    real = {"publish": files._publish, "put": zarr_local._put, "fsync": os.fsync,
            "parquet": pl.DataFrame.write_parquet}

    def publish(tmp, path):
        fault.hit("atomic")
        return real["publish"](tmp, path)

    def put(path, value, exclusive=False):
        fault.hit("zarr")
        return real["put"](path, value, exclusive)

    def fsync(fd):
        fault.hit("fsync")
        return real["fsync"](fd)

    def write_parquet(self, *args, **kwargs):
        try:
            fault.hit("parquet")
        except OSError as err:
            raise _polars_error(err) from None
        return real["parquet"](self, *args, **kwargs)

    files._publish, zarr_local._put, os.fsync = publish, put, fsync
    pl.DataFrame.write_parquet = write_parquet
    try:
        yield fault
    finally:
        files._publish, zarr_local._put, os.fsync = real["publish"], real["put"], real["fsync"]
        pl.DataFrame.write_parquet = real["parquet"]
