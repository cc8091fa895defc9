"""The feature store: one directory that plain zarr / polars / json can read.

Layout of a store S:
    S/features.zarr           Zarr v3 array (N, D), float16 or float32, chunked and sharded
    S/features_layer-4.zarr   one sibling array per extra layer (named in the manifest)
    S/texts.parquet           text_id, text, row, n_tokens, truncated -- the committed rows
    S/manifest.json           fingerprint, its parts, arrays, dim, n_texts
    S/.lock                   held by the one writer (the OS drops it when the writer dies)

Commit protocol (what makes a SIGKILL at any moment safe):
  1. a new store is built as `S.incomplete/` (empty arrays, empty table, manifest) and renamed to S;
  2. rows are only ever appended: features for rows [n, m) are written to the arrays first
     (zarr's LocalStore writes every shard file and zarr.json via temp file + os.replace, so a
     shard holding committed rows is either the old or the new whole file, never half of one);
  3. then texts.parquet is replaced atomically (temp + os.replace) by the table with rows [0, m):
     this is the commit point. manifest.json (n_texts) follows, also atomically;
  4. opening for writing reconciles: texts.parquet is the truth, arrays are cut back to its length
     (rows past it were never committed and are recomputed), the manifest is rewritten, and zarr's
     stray `*.partial` temp files are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import zarr
from filelock import FileLock, Timeout

from headstore.data.files import atomic_write_bytes, atomic_write_parquet

MANIFEST = "manifest.json"
TEXTS = "texts.parquet"
LOCK = ".lock"
FINGERPRINT_PARTS = ("model_id", "weights_hash", "tokenizer_hash", "pooling", "layers",
                     "max_length", "dtype", "precision", "code_version")
TEXTS_SCHEMA = {"text_id": pl.String, "text": pl.String, "row": pl.Int64,
                "n_tokens": pl.Int32, "truncated": pl.Boolean}


class StoreError(ValueError):
    """A store that cannot be used as asked (fingerprint mismatch, missing, locked)."""


def fingerprint_of(parts: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of the fingerprint parts."""
    canonical = json.dumps({k: parts[k] for k in FINGERPRINT_PARTS}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def array_names(layers: Sequence[int]) -> dict[str, int]:
    """The first listed layer is `features`; every other one `features_layer{L}`."""
    return {("features" if i == 0 else f"features_layer{layer}"): layer
            for i, layer in enumerate(layers)}


def _write_table(path: Path, table: pl.DataFrame) -> None:
    atomic_write_parquet(path, table, before_publish=lambda: crash_point("table_written"))


_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Test hook: HEADSTORE_CRASH_AT='name:k' SIGKILLs this process the k-th time it passes `name`."""
    target = os.environ.get("HEADSTORE_CRASH_AT")
    if not target:
        return
    point, _, count = target.partition(":")
    if point != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if _crash_counts[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


class FeatureStore:
    """Read access to a store. Open with `FeatureStore.open(path)`."""

    def __init__(self, path: Path, manifest: dict, texts: pl.DataFrame):
        self.path = path
        self.manifest = manifest
        self.texts = texts  # committed rows, sorted by row
        self._row_of: dict[str, int] | None = None

    @classmethod
    def open(cls, path: str | Path) -> "FeatureStore":
        path = Path(path)
        if not (path / MANIFEST).is_file():
            raise StoreError(f"{path}: not a feature store (no {MANIFEST})")
        manifest = json.loads((path / MANIFEST).read_text())
        texts = pl.read_parquet(path / TEXTS).sort("row")
        return cls(path, manifest, texts)

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def arrays(self) -> list[str]:
        return list(self.manifest["arrays"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def n_texts(self) -> int:
        return self.texts.height  # the committed rows (the manifest may lag after a crash)

    def array(self, name: str = "features") -> zarr.Array:
        if name not in self.manifest["arrays"]:
            raise KeyError(f"{self.path}: no array {name!r}; arrays: {self.arrays}")
        return zarr.open_array(self.path / self.manifest["arrays"][name]["path"], mode="r")

    def features(self, array: str = "features") -> np.ndarray:
        """The whole array (committed rows only) as float32 (N, D)."""
        return np.asarray(self.array(array)[: self.n_texts], dtype=np.float32)

    def rows_for(self, text_ids: Sequence[str]) -> np.ndarray:
        """Row of each text_id (int64); KeyError naming the first text that is not stored."""
        if self._row_of is None:
            self._row_of = dict(zip(self.texts["text_id"].to_list(), self.texts["row"].to_list()))
        try:
            return np.fromiter((self._row_of[t] for t in text_ids), dtype=np.int64,
                               count=len(text_ids))
        except KeyError as err:
            raise KeyError(f"{self.path}: text_id {err.args[0]} is not in the store; "
                           "featurize the dataset into it first") from None


def _create_array(path: Path, dim: int, dtype: str, chunk_rows: int, shard_rows: int) -> None:
    zarr.create_array(store=str(path), shape=(0, dim), dtype=dtype, chunks=(chunk_rows, dim),
                      shards=(shard_rows, dim), compressors=None, fill_value=0,
                      zarr_format=3, overwrite=True)


class StoreWriter:
    """The single writer of a store: holds `.lock`, appends rows, commits atomically."""

    def __init__(self, path: Path, manifest: dict, lock: FileLock):
        self.path = path
        self.manifest = manifest
        self.lock = lock
        self.texts = pl.read_parquet(path / TEXTS).sort("row")
        self.arrays = {name: zarr.open_array(path / spec["path"], mode="r+")
                       for name, spec in manifest["arrays"].items()}
        self._reconcile()

    @classmethod
    def open_or_create(cls, path: str | Path, parts: dict, dim: int, chunk_rows: int = 256,
                       shard_rows: int = 65536) -> "StoreWriter":
        """Open S for writing (refusing another fingerprint or a second writer), creating it if absent."""
        path = Path(path)
        if path.exists() and not path.is_dir() or (
                path.is_dir() and any(path.iterdir()) and not (path / MANIFEST).is_file()):
            raise StoreError(f"{path}: exists and is not a feature store (no {MANIFEST}); "
                             "give a new or an existing store path")
        if not (path / MANIFEST).is_file():
            _create(path, parts, dim, chunk_rows, shard_rows)
        lock = FileLock(str(path / LOCK), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise StoreError(f"{path}: another process is writing this store (lock {path / LOCK} "
                             "is held); wait for it to finish") from None
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            check_fingerprint(path, manifest, parts)
            return cls(path, manifest, lock)
        except BaseException:
            lock.release()
            raise

    @property
    def n_texts(self) -> int:
        return self.texts.height

    def text_ids(self) -> set[str]:
        return set(self.texts["text_id"].to_list())

    def _reconcile(self) -> None:
        """Make arrays and manifest agree with texts.parquet (the commit record) after a crash."""
        n = self.n_texts
        assert self.texts["row"].to_list() == list(range(n)), "texts.parquet rows are not 0..N-1"
        for name, arr in self.arrays.items():
            if arr.shape[0] != n:
                arr.resize((n, arr.shape[1]))
            for stray in (self.path / self.manifest["arrays"][name]["path"]).rglob("*.partial"):
                stray.unlink()
        for stray in [*self.path.glob(".*.tmp"), *self.path.glob(".*.incomplete")]:
            stray.unlink()
        if self.manifest["n_texts"] != n:
            self._write_manifest()

    def write_rows(self, start: int, features: dict[str, np.ndarray]) -> None:
        """Write features for rows [start, start+B) of every array (not yet committed)."""
        assert start == self.n_texts, "rows are appended right after the committed ones"
        for name, arr in self.arrays.items():
            block = features[name]  # (B, D)
            stop = start + block.shape[0]
            if arr.shape[0] < stop:
                arr.resize((stop, arr.shape[1]))
            crash_point("resized")
            arr[start:stop] = block
        crash_point("features_written")

    def commit(self, rows: pl.DataFrame) -> None:
        """Make rows (text_id, text, row, n_tokens, truncated) part of the store, atomically."""
        assert rows["row"].to_list() == list(range(self.n_texts, self.n_texts + rows.height))
        table = pl.concat([self.texts, rows.select(list(TEXTS_SCHEMA)).cast(TEXTS_SCHEMA)])
        _write_table(self.path / TEXTS, table)
        self.texts = table
        crash_point("committed")
        self._write_manifest()

    def _write_manifest(self) -> None:
        self.manifest = {**self.manifest, "n_texts": self.n_texts}
        atomic_write_bytes(self.path / MANIFEST, json.dumps(self.manifest, indent=2).encode())

    def close(self) -> None:
        if self.lock.is_locked:
            self.lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_fingerprint(path: Path, manifest: dict, parts: dict) -> None:
    """StoreError naming every differing part when the store was made with other settings."""
    if manifest["fingerprint"] == fingerprint_of(parts):
        return
    diffs = [f"{k}: store has {manifest.get(k)!r}, this run has {parts[k]!r}"
             for k in FINGERPRINT_PARTS if manifest.get(k) != parts[k]]
    raise StoreError(f"{path}: fingerprint mismatch, refusing to mix features; differing parts:\n  "
                     + "\n  ".join(diffs or ["(manifest parts do not hash to its fingerprint)"])
                     + "\nuse another --store, or the store's settings")


def _create(path: Path, parts: dict, dim: int, chunk_rows: int, shard_rows: int) -> None:
    """Build an empty store in `S.incomplete/` under its own lock, then rename it to S."""
    tmp = path.with_name(path.name + ".incomplete")
    tmp.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(tmp / LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(f"{path}: another process is creating this store ({tmp})") from None
    try:
        if (path / MANIFEST).is_file():  # another writer finished creating it meanwhile
            return
        for child in tmp.iterdir():  # leftovers of a creator that died
            if child.name != LOCK:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        arrays = {}
        for name, layer in array_names(parts["layers"]).items():
            _create_array(tmp / f"{name}.zarr", dim, parts["dtype"], chunk_rows, shard_rows)
            arrays[name] = {"path": f"{name}.zarr", "layer": layer}
        _write_table(tmp / TEXTS, pl.DataFrame(schema=TEXTS_SCHEMA))
        manifest = {"fingerprint": fingerprint_of(parts),
                    **{k: parts[k] for k in FINGERPRINT_PARTS},
                    "arrays": arrays, "dim": dim, "n_texts": 0}
        atomic_write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
        if path.exists() and not any(path.iterdir()):
            path.rmdir()  # an empty directory the user made for it
        os.rename(tmp, path)  # fails if S exists and is not empty: never clobber
    finally:
        lock.release()
