"""The one way headstore writes a file: to a temporary name beside it, fsync, rename, fsync the folder.

A reader (or a rerun after a crash) sees either the old whole file or the new whole file, never
half of one. Every artefact (metrics.json, config.json, results.parquet, manifests) goes through here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

INCOMPLETE = ".incomplete"  # suffix of a file being written; never read as the real thing


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        with open(tmp, "wb") as f:
            f.write(data)
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


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
        frame.write_parquet(tmp, compression=compression)
        if before_publish is not None:
            before_publish()
        _publish(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
