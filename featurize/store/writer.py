"""The single writer of a store: creates it, holds `.lock`, appends committed segments.

One segment = rows [n, m): their features in every array, one texts part, one manifest update.
The order of a commit (each step survives a SIGKILL at any moment):
  1. features of rows [n, m) are written to the arrays (zarr writes every shard file and zarr.json
     via temp file + os.replace, so a shard holding committed rows is the old or the new whole file);
  2. the touched shard files, their folders and zarr.json are fsynced;
  3. the texts part `texts/part-K.parquet` is written (temp + fsync + rename + folder fsync);
  4. manifest.json, listing the part and n_texts = m, replaces the old one atomically: the commit.
Opening for writing reconciles: arrays are cut back to the manifest's n_texts, parts it does not
list and temp files are removed (an interrupted commit is simply redone by the rerun).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import zarr
from filelock import FileLock, Timeout
from zarr.codecs import Crc32cCodec

from headstore.data.files import atomic_write_bytes, atomic_write_parquet, fsync_dir, writing
from headstore.featurize.store.layout import (FINGERPRINT_PARTS, FORMAT_VERSION, LOCK, MANIFEST, OPTIONAL_PARTS,
                                              TEXTS_DIR, TEXTS_SCHEMA, StoreError, check_fingerprint, store_arrays,
                                              crash_point, fingerprint_of, format_version, read_manifest, shard_file,
                                              shard_rows_of)


def create_array(path: Path, dim: int, dtype: str, chunk_rows: int, shard_rows: int) -> zarr.Array:
    """An empty (0, dim) array, sharded, each chunk followed by its crc32c checksum."""
    return zarr.create_array(store=str(path), shape=(0, dim), dtype=dtype, chunks=(chunk_rows, dim),
                             shards=(shard_rows, dim), compressors=[Crc32cCodec()], fill_value=0,
                             zarr_format=3, overwrite=True)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_rows(array_path: Path, arr: zarr.Array, start: int, stop: int) -> None:
    """fsync the shard files holding rows [start, stop), their folders and the array metadata."""
    step = shard_rows_of(arr)
    folders = {array_path}
    for shard in range(start // step, (stop - 1) // step + 1):
        file = shard_file(array_path, arr, shard)
        fsync_file(file)
        folders.update(p for p in file.parents if array_path in p.parents)
    fsync_file(array_path / "zarr.json")
    for folder in sorted(folders, key=lambda p: -len(p.parts)):  # deepest first
        fsync_dir(folder)


def write_part(folder: Path, number: int, rows: pl.DataFrame, start: int) -> dict:
    """Write texts part `number` (rows starting at `start`); its manifest entry."""
    name = f"part-{number:06d}.parquet"
    atomic_write_parquet(folder / name, rows.select(list(TEXTS_SCHEMA)).cast(TEXTS_SCHEMA),
                         before_publish=lambda: crash_point("table_written"))
    data = (folder / name).read_bytes()
    return {"path": f"{TEXTS_DIR}/{name}", "start": start, "n_rows": rows.height,
            "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_manifest(path: Path, manifest: dict) -> None:
    atomic_write_bytes(path / MANIFEST, json.dumps(manifest, indent=1).encode())


def acquire_lock(path: Path) -> FileLock:
    lock = FileLock(str(path / LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(f"{path}: another process is writing this store (lock {path / LOCK} "
                         "is held); wait for it to finish") from None
    except OSError as err:
        raise StoreError(f"{path}: cannot write to the store ({err.strerror}: a read-only store "
                         "can be read, and featurized into only when nothing is new)") from None
    return lock


class StoreWriter:
    """Holds the lock; `append` commits one segment."""

    def __init__(self, path: Path, manifest: dict, lock: FileLock):
        self.path = path
        self.manifest = manifest
        self.lock = lock
        # what made the rows this writer commits, within the fingerprint's bounds ({"backend": name}: featurize.
        # backends); kept in each part's manifest entry (store.segment_backends reads it)
        self.provenance: dict = {}
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
        lock = acquire_lock(path)
        try:
            manifest = read_manifest(path)
            if format_version(manifest) != FORMAT_VERSION:
                raise StoreError(f"{path}: a store of format {format_version(manifest)} (one "
                                 f"texts.parquet); convert it once with `cli store migrate {path}`, "
                                 "then rerun (reading it works as it is)")
            check_fingerprint(path, manifest, parts)
            return cls(path, manifest, lock)
        except BaseException:
            lock.release()
            raise

    @property
    def n_texts(self) -> int:
        return int(self.manifest["n_texts"])

    def _reconcile(self) -> None:
        """Remove what an interrupted commit left: array rows past n_texts, unlisted parts, temps."""
        n = self.n_texts
        for name, arr in self.arrays.items():
            array_path = self.path / self.manifest["arrays"][name]["path"]
            if arr.shape[0] < n:
                raise StoreError(f"{array_path}: {arr.shape[0]} rows, but {n} are committed: the "
                                 f"store is corrupted (run `cli store verify {self.path}`)")
            if arr.shape[0] > n:
                arr.resize((n, arr.shape[1]))
            for stray in array_path.rglob("*.partial"):
                stray.unlink()
        listed = {self.path / p["path"] for p in self.manifest["parts"]}
        texts = self.path / TEXTS_DIR
        for stray in texts.iterdir() if texts.is_dir() else []:
            if stray not in listed:
                stray.unlink()
        for stray in [*self.path.glob(".*.incomplete"), *self.path.glob(".*.tmp")]:
            stray.unlink()
        shutil.rmtree(self.path / ".ray-staging", ignore_errors=True)  # a killed ray driver's

    def append(self, features: dict[str, np.ndarray], rows: pl.DataFrame) -> None:
        """Commit rows [n, n + B): features (name -> (B, D)) and their texts rows, atomically. A commit that
        fails (a full disk) leaves the store as its last commit (its leftovers removed where the disk
        allows; else the next writer removes them)."""
        try:
            self._append(features, rows)
        except Exception:
            try:  # against the manifest on disk: the commit may have happened (a failed fsync after the rename)
                self.manifest = read_manifest(self.path)
                self._reconcile()
            except Exception:  # noqa: BLE001 -- the error that stopped the commit is the one to report
                pass
            raise

    def _append(self, features: dict[str, np.ndarray], rows: pl.DataFrame) -> None:
        start = self.n_texts
        stop = start + rows.height
        assert rows["row"].to_list() == list(range(start, stop)), "rows must follow the committed ones"
        for name, arr in self.arrays.items():
            block = features[name]  # (B, D)
            assert block.shape[0] == rows.height
            with writing(self.path / self.manifest["arrays"][name]["path"]):  # an OS error names the array
                if arr.shape[0] < stop:
                    arr.resize((stop, arr.shape[1]))
                crash_point("resized")
                arr[start:stop] = block
        crash_point("features_written")
        for name, arr in self.arrays.items():
            with writing(self.path / self.manifest["arrays"][name]["path"]):
                fsync_rows(self.path / self.manifest["arrays"][name]["path"], arr, start, stop)
        number = int(self.manifest["next_part"])
        part = {**write_part(self.path / TEXTS_DIR, number, rows, start), **self.provenance}
        self.commit_manifest(parts=[*self.manifest["parts"], part], n_texts=stop,
                             next_part=number + 1)
        crash_point("committed")

    def commit_manifest(self, **changes) -> None:
        """Replace the manifest (the commit point) with these keys changed."""
        manifest = {**self.manifest, **changes}
        write_manifest(self.path, manifest)
        self.manifest = manifest

    def close(self) -> None:
        if self.lock.is_locked:
            self.lock.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def new_manifest(parts: dict, dim: int, arrays: dict, chunk_rows: int, shard_rows: int) -> dict:
    return {"format_version": FORMAT_VERSION, "fingerprint": fingerprint_of(parts),
            **{k: parts[k] for k in FINGERPRINT_PARTS}, **{k: parts[k] for k in OPTIONAL_PARTS if k in parts},
            "arrays": arrays, "dim": dim, "chunk_rows": chunk_rows, "shard_rows": shard_rows,
            "n_texts": 0, "next_part": 0, "parts": []}


def _create(path: Path, parts: dict, dim: int, chunk_rows: int, shard_rows: int) -> None:
    """Build an empty store in `S.incomplete/` under its own lock, then rename it to S."""
    tmp = path.with_name(path.name + ".incomplete")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(f"{path}: cannot create the store ({err.strerror})") from None
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
        for name, info in store_arrays(parts).items():
            with writing(path / f"{name}.zarr"):  # an OS error (a full disk) names the array
                create_array(tmp / f"{name}.zarr", info.get("dim", dim), parts["dtype"], chunk_rows, shard_rows)
            arrays[name] = {"path": f"{name}.zarr", **info}
            if parts.get("normalize") and "tap" not in info and info["layer"] == -1:  # the model's Normalize, on read
                arrays[name]["normalize"] = True
        (tmp / TEXTS_DIR).mkdir()
        write_manifest(tmp, new_manifest(parts, dim, arrays, chunk_rows, shard_rows))
        crash_point("table_written")
        for folder in [*tmp.rglob("*")]:
            if folder.is_dir():
                fsync_dir(folder)
        if path.exists() and not any(path.iterdir()):
            path.rmdir()  # an empty directory the user made for it
        os.rename(tmp, path)  # fails if S exists and is not empty: never clobber
        fsync_dir(path.parent)
    finally:
        lock.release()
