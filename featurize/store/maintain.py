"""`cli store migrate` (format 1 -> 2, in place; a model's Normalize recorded) and `cli store compact` (merge
small texts parts).

A store of a sentence-transformers model's mean-pooled features made before `--pooling model` existed (MiniLM:
mean pooling then Normalize) becomes that model's `--pooling model` store by recording the Normalize, which is
applied on read: the manifest is rewritten (atomically) with `normalize` and a new fingerprint, no row is
encoded again (`_record_normalize`).

Migrate builds the format-2 store beside the old files, in `S/.migrate.incomplete/`: one texts part
holding every committed row, and each array copied shard by shard into a new array whose chunks
carry crc32c checksums (same chunking). Renaming that folder to `S/.migrate.ready/` marks the copy
complete; the arrays are then swapped in and the format-2 manifest replaces the old one (the commit
point), and the old texts.parquet goes. Killed anywhere, a rerun of migrate finishes the job; until
the manifest is replaced the store stays a readable format-1 store (the swapped arrays hold the
same numbers).

Compact first checks every committed part (size and sha256, store.check_part) and refuses a damaged
store naming the file; it then rewrites runs of small consecutive parts of one backend (the provenance each part
records, featurize.encoder.backends) as one part each, commits the manifest listing the
merged parts, then deletes the old files (a crash in between leaves unlisted files, which the next
writer removes). Reads are correct with or without it; it only bounds the number of files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from headstore.data.files import fsync_dir, writing
from headstore.featurize.encoder.model import model_identity
from headstore.featurize.encoder.sentence import SentenceSpec, read_model_spec
from headstore.featurize.store.layout import (LEGACY_TEXTS, MANIFEST, TEXTS_DIR, TEXTS_SCHEMA, StoreError, check_part,
                                              fingerprint_of, format_version, read_manifest, shard_rows_of)
from headstore.featurize.store.writer import (StoreWriter, acquire_lock, create_array, fsync_rows,
                                        new_manifest, write_manifest, write_part)

STAGING, READY, OLD = ".migrate.incomplete", ".migrate.ready", ".migrate.old"


def migrate_store(path: str | Path, model: str | None = None) -> dict:
    """Convert a format-1 store to format 2 in place, then record the model's Normalize where the store
    holds a sentence-transformers model's mean-pooled features from before `--pooling model` (a no-op
    summary for a store that needs neither)."""
    path = Path(path)
    lock = acquire_lock(path) if (path / MANIFEST).is_file() else None
    if lock is None:
        read_manifest(path)  # the StoreError for "not a store"
    try:
        manifest = read_manifest(path)
        summary = {"store": str(path), "format_version": 2, "migrated": False}
        if format_version(manifest) != 2 or (path / READY).exists():
            if not (path / READY).exists():
                with writing(path / STAGING):  # an OS error (a full disk) names the folder
                    _stage(path, manifest)
            _swap_in(path)
            summary.update(migrated=True, n_texts=read_manifest(path)["n_texts"])
        summary["normalize_recorded"], note = _record_normalize(path, read_manifest(path), model)
        summary["changed"] = summary["migrated"] or summary["normalize_recorded"]
        summary["status"] = ("needs no change" if not summary["changed"] else
                             ", ".join(w for w, done in (("migrated to format 2", summary["migrated"]),
                                                        ("the model's Normalize recorded", summary["normalize_recorded"]))
                                       if done))
        if note:
            summary["note"] = note
        return summary
    finally:
        if lock is not None:
            lock.release()


def _record_normalize(path: Path, manifest: dict, model: str | None) -> tuple[bool, str | None]:
    """Record a model's final Normalize (applied on read, featurize.encoder.sentence) in a store of its plain
    mean-pooled features: only when the model the store names (`model`, else its config.json `model`, else its
    model id) has the store's weights and tokenizer and its modules are exactly mean pooling then Normalize. The
    stored numbers stay; the manifest (and so the fingerprint) changes, atomically. (recorded, a note): a model
    that cannot be found (and was not given) leaves the store as it is, with a note saying how to check it."""
    if manifest.get("pooling") != "mean" or any(k in manifest for k in ("normalize", "dense", "include_prompt")):
        return False, None
    name = model or _featurized_with(path) or manifest.get("model_id")
    try:
        identity = model_identity(name, int(manifest["max_length"]))
    except (ValueError, FileNotFoundError) as err:
        if model:
            raise StoreError(f"{path}: --model {model}: cannot be found ({err})") from None
        return False, (f"the model the store was made with ({name}) is not found here, so whether its features "
                       f"lack the model's Normalize was not checked; `cli store migrate {path} --model M` checks it")
    if (identity.weights_hash, identity.tokenizer_hash) != (manifest["weights_hash"], manifest["tokenizer_hash"]):
        raise StoreError(f"{path}: {name} is not the model the store was made with (weights or tokenizer hash "
                         "differ); give --model with that model")
    spec = read_model_spec(Path(identity.model_dir))
    if spec is None or spec != SentenceSpec(("mean",), normalize=True):
        return False, None  # not a mean-then-Normalize model: its mean-pooled store is already what it is
    arrays = {n: {**a, "normalize": True} if a.get("layer") == -1 else a for n, a in manifest["arrays"].items()}
    parts = {**manifest, **spec.parts()}
    write_manifest(path, {**manifest, **spec.parts(), "arrays": arrays, "fingerprint": fingerprint_of(parts)})
    return True, None


def _featurized_with(path: Path) -> str | None:
    config = path / "config.json"
    try:
        return json.loads(config.read_text()).get("model") if config.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _stage(path: Path, manifest: dict) -> None:
    staging = path / STAGING
    if staging.exists():
        shutil.rmtree(staging)  # a migration killed while copying: start the copy again
    staging.mkdir()
    (staging / TEXTS_DIR).mkdir()
    try:
        texts = pl.read_parquet(path / LEGACY_TEXTS).sort("row")
    except Exception as err:
        raise StoreError(f"{path / LEGACY_TEXTS}: cannot be read ({err}); cannot migrate a "
                         "damaged store") from None
    n = texts.height
    if texts["row"].to_list() != list(range(n)):
        raise StoreError(f"{path / LEGACY_TEXTS}: rows are not 0..{n - 1}; cannot migrate "
                         f"(run `cli store verify {path}`)")
    parts = [write_part(staging / TEXTS_DIR, 0, texts, 0)] if n else []
    arrays = {}
    chunk_rows = shard_rows = None
    for name, spec in manifest["arrays"].items():
        old = zarr.open_array(path / spec["path"], mode="r")
        if old.shape[0] < n:
            raise StoreError(f"{path / spec['path']}: {old.shape[0]} rows, {n} committed; "
                             "cannot migrate a damaged store")
        chunk_rows, shard_rows = int(old.chunks[0]), shard_rows_of(old)
        new = create_array(staging / spec["path"], int(manifest["dim"]), manifest["dtype"],
                           chunk_rows, shard_rows)
        new.resize((n, new.shape[1]))
        for start in range(0, n, shard_rows):
            block = old[start: min(n, start + shard_rows)]
            if not np.isfinite(block).all():
                raise StoreError(f"{path / spec['path']}: NaN/inf in rows {start}.."
                                 f"{start + len(block) - 1}; cannot migrate a damaged store")
            new[start: start + len(block)] = block
        if n:
            fsync_rows(staging / spec["path"], new, 0, n)
        arrays[name] = spec
    parts_fp = {k: manifest[k] for k in manifest}  # the fingerprint parts, unchanged
    fresh = new_manifest(parts_fp, int(manifest["dim"]), arrays, chunk_rows or 256,
                         shard_rows or 65536)
    assert fresh["fingerprint"] == manifest["fingerprint"], "migration must keep the fingerprint"
    write_manifest(staging, {**fresh, "n_texts": n, "next_part": len(parts), "parts": parts})
    fsync_dir(staging / TEXTS_DIR)
    fsync_dir(staging)
    os.rename(staging, path / READY)
    fsync_dir(path)


def _swap_in(path: Path) -> None:
    """Move the staged arrays and texts into place, then the manifest (idempotent)."""
    ready, old = path / READY, path / OLD
    old.mkdir(exist_ok=True)
    manifest = read_manifest(ready)
    for item in [TEXTS_DIR, *(spec["path"] for spec in manifest["arrays"].values())]:
        if not (ready / item).exists():
            continue  # moved by an earlier, interrupted swap
        if (path / item).exists():
            target = old / item
            if target.exists():
                shutil.rmtree(target)
            os.rename(path / item, target)
        os.rename(ready / item, path / item)
    fsync_dir(path)
    os.replace(ready / MANIFEST, path / MANIFEST)  # the commit point: format 2 from here on
    fsync_dir(path)
    (path / LEGACY_TEXTS).unlink(missing_ok=True)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(ready, ignore_errors=True)


def compact_store(path: str | Path, target_rows: int = 1 << 20) -> dict:
    """Merge runs of consecutive parts into parts of up to target_rows rows."""
    path = Path(path)
    lock = acquire_lock(path)
    try:
        manifest = read_manifest(path)
        if format_version(manifest) != 2:
            raise StoreError(f"{path}: a format-1 store has one texts file; nothing to compact "
                             f"(`cli store migrate {path}` converts it)")
        for part in manifest["parts"]:  # a damaged part is refused before anything is rewritten
            try:
                check_part(path, part)
            except StoreError as err:
                raise StoreError(f"{err}; nothing was compacted") from None
        writer = StoreWriter(path, manifest, lock)  # reconciles leftovers first
        groups, current = [], []
        for part in writer.manifest["parts"]:
            if current and (sum(p["n_rows"] for p in current) + part["n_rows"] > target_rows
                            or part.get("backend") != current[0].get("backend")):  # each part keeps its provenance
                groups.append(current)
                current = []
            current.append(part)
        if current:
            groups.append(current)
        number = int(writer.manifest["next_part"])
        new_parts, replaced = [], []
        for group in groups:
            if len(group) == 1:
                new_parts.append(group[0])
                continue
            frame = pl.concat([pl.read_parquet(path / p["path"]) for p in group]).cast(TEXTS_SCHEMA)
            new_parts.append({**write_part(path / TEXTS_DIR, number, frame, group[0]["start"]),
                              **({"backend": group[0]["backend"]} if "backend" in group[0] else {})})
            number += 1
            replaced += [path / p["path"] for p in group]
        before = len(writer.manifest["parts"])
        if replaced:
            writer.commit_manifest(parts=new_parts, next_part=number)
            for file in replaced:
                file.unlink(missing_ok=True)
            fsync_dir(path / TEXTS_DIR)
        return {"store": str(path), "parts_before": before, "parts_after": len(new_parts)}
    finally:
        lock.release()
