"""The one way headstore writes a file: to a temporary name beside it, fsync, rename, fsync the folder.

A reader (or a rerun after a crash) sees either the old whole file or the new whole file, never
half of one. Every artefact (metrics.json, config.json, results.parquet, manifests) goes through here.
"""

from __future__ import annotations

import contextlib
import errno as errnos
import json
import os
import re
from pathlib import Path

INCOMPLETE = ".incomplete"  # suffix of a file being written; never read as the real thing


# what fsync of a folder may answer where folders cannot be synced (a no-op there); any other error (EIO:
# the rename may not be on the disk) is raised
FSYNC_DIR_UNSUPPORTED = (errnos.EINVAL, errnos.ENOTSUP, errnos.EBADF, errnos.EACCES, errnos.EISDIR, errnos.EPERM)
TEMP_MARKS = (INCOMPLETE, ".partial")  # temporary names (ours, zarr's): an error names the real file instead


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened or synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in FSYNC_DIR_UNSUPPORTED:
            raise OSError(err.errno, err.strerror, str(path)) from None
    finally:
        os.close(fd)


def os_error_of(err: BaseException, path: str | Path) -> OSError | None:
    """The OS error `err` reports, as an OSError naming the file (its own, else `path`); None when `err`
    is no OS error. Polars and FAISS report one inside their own errors ("... (os error 28)")."""
    if isinstance(err, OSError) and err.errno:
        own = err.filename if err.filename and not any(m in str(err.filename) for m in TEMP_MARKS) else None
        return OSError(err.errno, err.strerror or os.strerror(err.errno), own or str(path))
    code = None
    if type(err).__module__.startswith("polars"):  # "... underlying IO error: ... (os error 28)"
        found = re.search(r"os error (\d+)\)", str(err))
        code = int(found[1]) if found else None
    elif isinstance(err, RuntimeError) and str(err).startswith("Error in") and "faiss" in str(err):
        found = re.search(r"\(([^()]+)\)\s*$", str(err))  # "... write error in F: 4051 != 3200000 (No space ...)"
        code = next((c for c in errnos.errorcode if found and os.strerror(c) == found[1]), None)
    if code in errnos.errorcode:
        return OSError(code, os.strerror(code), str(path))
    return None


@contextlib.contextmanager
def writing(path: str | Path):
    """Any OS error of the block (a full disk, a quota, a vanished or read-only folder) raised as an
    OSError naming the file: the CLI shows it as one line."""
    try:
        yield
    except Exception as err:
        named = os_error_of(err, path)
        if named is None or named is err:
            raise
        raise named from None


def _tmp_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{INCOMPLETE}")


def _publish(tmp: Path, path: Path) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    tmp = _tmp_of(path)
    try:
        with writing(path):
            with open(tmp, "wb") as f:
                f.write(data)
            _publish(tmp, path)
    finally:
        _remove(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_figure(fig, path: str | Path, **savefig) -> None:
    """A matplotlib figure (its format from the file's suffix), written whole or not at all."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", **savefig)
    atomic_write_bytes(path, buffer.getvalue())


def atomic_write_json(path: str | Path, obj, indent: int = 2, sort_keys: bool = False) -> None:
    """JSON with floats as floats (numpy scalars included) and anything else as its str."""
    def default(x):
        try:
            return float(x)
        except (TypeError, ValueError):
            return str(x)

    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default))


def atomic_write_parquet(path: str | Path, frame, compression: str = "zstd", before_publish=None) -> None:
    """A polars frame to Parquet; ``before_publish()`` runs between the write and the rename (tests
    use it as a crash point)."""
    path = Path(path)
    tmp = _tmp_of(path)
    try:
        with writing(path):
            frame.write_parquet(tmp, compression=compression)
        if before_publish is not None:
            before_publish()
        with writing(path):
            _publish(tmp, path)
    finally:
        _remove(tmp)


def read_parquet_or_explain(path: str | Path, remedy: str):
    """A Parquet file this module wrote, as a polars DataFrame; one that cannot be read (truncated, foreign) is a
    ValueError naming the file, polars' first line of the problem and `remedy` (what the user can do)."""
    import polars as pl

    try:
        return pl.read_parquet(path)
    except Exception as e:  # polars raises ComputeError / OSError for a truncated or foreign file
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {str(e).strip().splitlines()[0][:160]}) "
                         f"({remedy})") from None


def _remove(tmp: Path) -> None:
    """Remove a temporary file if it is there; a folder that vanished or turned read-only leaves it (the
    error that stopped the write is the one to report)."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass
