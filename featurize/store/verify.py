"""`store verify` (integrity problems as a list) and `store info` (a summary) for a feature store.

verify reads everything, part by part and shard by shard (bounded memory): the manifest (JSON, keys,
fingerprint), every texts part (present, size and sha256 as committed, readable, rows contiguous,
ids = hash(text), no id twice), every feature shard (present, every chunk's crc32c, no NaN/inf), and
the leftovers of an interrupted run (rows and parts past the commit record: rerun featurize).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from headstore.featurize.store.ids import IdSet, digests, keys_of_digests, keys_of_hex
from headstore.featurize.store.layout import (FINGERPRINT_PARTS, FORMAT_VERSION, LEGACY_TEXTS, MANIFEST, TEXTS_DIR,
                                              TEXTS_SCHEMA, array_dim, bytes_per_text, fingerprint_of, shard_file,
                                              shard_rows_of)
from headstore.featurize.store.reader import FeatureStore

RERUN = "an interrupted featurize: rerunning featurize into this store completes it"


def verify_store(path: str | Path) -> list[str]:
    """Every integrity problem found (empty list = the store is sound)."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        return [f"{path}: no {MANIFEST} (not a feature store, or its creation never finished)"]
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return [f"{path / MANIFEST}: not valid JSON ({err})"]
    if not isinstance(manifest, dict):
        return [f"{path / MANIFEST}: not a JSON object"]
    version = manifest.get("format_version", 1)
    required = (*FINGERPRINT_PARTS, "fingerprint", "arrays", "dim", "n_texts")
    if version == FORMAT_VERSION:
        required += ("parts", "next_part")
    elif version != 1:
        return [f"{path / MANIFEST}: unknown format_version {version!r}"]
    missing = [k for k in required if k not in manifest]
    if missing:
        return [f"{path / MANIFEST}: missing keys {missing}"]
    problems = []
    if fingerprint_of(manifest) != manifest["fingerprint"]:
        problems.append(f"{path / MANIFEST}: fingerprint does not match its parts (edited or corrupted)")
    if version == 1:
        n, texts_problems = _verify_legacy_texts(path, manifest)
        problems += texts_problems
    else:
        n, texts_problems = _verify_parts(path, manifest)
        problems += texts_problems
    if n is None:
        return problems
    for name, spec in manifest["arrays"].items():
        problems += _verify_array(path / spec["path"], name, n, manifest)
    return problems


def _check_table(where: str, table: pl.DataFrame, start: int, ids: IdSet, prompts=("",)) -> list[str]:
    """Schema, rows start..start+len-1 in order, text_id = hash(text), ids not seen before."""
    schema_diff = {k: str(v) for k, v in TEXTS_SCHEMA.items() if table.schema.get(k) != v}
    if schema_diff:
        return [f"{where}: columns missing or of the wrong type: {schema_diff}"]
    problems = []
    rows = table["row"].to_numpy()
    expected = np.arange(start, start + table.height)
    if not np.array_equal(rows, expected):
        at = int(np.argmax(rows != expected))
        problems.append(f"{where}: rows are not {start}..{start + table.height - 1} in order "
                        f"(row {rows[at]} at position {at}; duplicated or missing rows)")
    stored = keys_of_hex(table["text_id"])
    bad = np.arange(table.height)
    for prompt in prompts:  # a row's id is its text's under one of the store's prompts (featurize roles)
        keys = keys_of_digests(digests(table["text"].to_list(), prompt))
        bad = bad[(keys[bad] != stored[bad]).any(axis=1)]
    if len(bad):
        problems.append(f"{where}: {len(bad)} text_id(s) do not match hash(text), "
                        f"e.g. row {rows[bad[0]]}")
    seen = ids.contains(stored)
    n_dup = int(seen.sum()) + table.height - len(np.unique(stored, axis=0))
    if n_dup:
        problems.append(f"{where}: {n_dup} duplicated text_id(s)")
    ids.add(stored)
    return problems


def _verify_legacy_texts(path: Path, manifest: dict) -> tuple[int | None, list[str]]:
    try:
        texts = pl.read_parquet(path / LEGACY_TEXTS).sort("row")
    except Exception as err:  # unreadable parquet: report, do not crash
        return None, [f"{path / LEGACY_TEXTS}: cannot be read ({err})"]
    problems = _check_table(str(path / LEGACY_TEXTS), texts, 0, IdSet())
    if manifest["n_texts"] != texts.height:
        problems.append(f"{path / MANIFEST}: n_texts {manifest['n_texts']} but {LEGACY_TEXTS} has "
                        f"{texts.height} rows ({RERUN})")
    return texts.height, problems


def _verify_parts(path: Path, manifest: dict) -> tuple[int, list[str]]:
    problems, ids, start = [], IdSet(), 0
    listed = set()
    for part in manifest["parts"]:
        file = path / part["path"]
        listed.add(file)
        if part["start"] != start:
            problems.append(f"{path / MANIFEST}: part {part['path']} starts at row {part['start']}, "
                            f"expected {start} (parts must follow each other)")
        start = part["start"] + part["n_rows"]
        if not file.is_file():
            problems.append(f"{file}: missing (rows {part['start']}..{start - 1}; deleted?)")
            continue
        data = file.read_bytes()
        if len(data) != part["bytes"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
            problems.append(f"{file}: {len(data)} bytes, sha256 differs from the one committed "
                            f"({part['bytes']} bytes): truncated, overwritten or edited")
        try:
            table = pl.read_parquet(file)
        except Exception as err:
            problems.append(f"{file}: cannot be read ({err})")
            continue
        if table.height != part["n_rows"]:
            problems.append(f"{file}: {table.height} rows, the manifest says {part['n_rows']}")
        prompts = tuple(dict.fromkeys((manifest.get("prompts") or {}).values())) or ("",)
        problems += _check_table(str(file), table, part["start"], ids, prompts)
    n = int(manifest["n_texts"])
    if start != n:
        problems.append(f"{path / MANIFEST}: n_texts {n}, but its parts hold {start} rows")
    texts = path / TEXTS_DIR
    strays = sorted(p.name for p in texts.iterdir() if p not in listed) if texts.is_dir() else []
    if strays:
        problems.append(f"{texts}: uncommitted file(s) {', '.join(strays[:3])}"
                        f"{' ...' if len(strays) > 3 else ''} ({RERUN}, or `cli store compact` "
                        "an interrupted compaction)")
    return n, problems


def _verify_array(array_path: Path, name: str, n: int, manifest: dict) -> list[str]:
    try:
        arr = zarr.open_array(array_path, mode="r")
    except Exception as err:
        return [f"{array_path}: cannot open {name} ({err})"]
    problems = []
    if arr.shape[0] > n:
        problems.append(f"{array_path}: rows {n}..{arr.shape[0] - 1} are uncommitted ({RERUN})")
    elif arr.shape[0] < n:
        problems.append(f"{array_path}: {arr.shape[0]} rows, but {n} are committed: rows "
                        f"{arr.shape[0]}..{n - 1} are lost")
    if arr.ndim != 2 or arr.shape[1] != array_dim(manifest, name):
        problems.append(f"{array_path}: shape {arr.shape}, expected ({n}, {array_dim(manifest, name)})")
        return problems
    if str(arr.dtype) != manifest["dtype"]:
        problems.append(f"{array_path}: dtype {arr.dtype}, manifest says {manifest['dtype']}")
    step = shard_rows_of(arr)
    n_bad, first_bad = 0, None
    for start in range(0, min(n, arr.shape[0]), step):
        file = shard_file(array_path, arr, start // step)
        if not file.is_file():
            problems.append(f"{file}: shard file missing (rows {start}..{min(n, start + step) - 1}"
                            f" of {name}; deleted?)")
            continue
        try:
            block = arr[start: min(n, start + step)]
        except Exception as err:  # a checksum mismatch, a truncated or garbled shard file
            problems.append(f"{file}: cannot read data ({type(err).__name__}: {err}): a damaged "
                            "or overwritten shard")
            continue
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            n_bad += int((~finite).sum())
            first_bad = first_bad if first_bad is not None else start + int(np.argmin(finite))
    if n_bad:
        problems.append(f"{array_path}: {n_bad} row(s) with NaN/inf, first at row {first_bad}")
    if manifest.get("format_version", 1) == FORMAT_VERSION and not any(
            c.get("name") == "crc32c" for c in _chunk_codecs(arr)):
        problems.append(f"{array_path}: its chunks carry no crc32c checksums (format 2 requires "
                        "them); corruption inside it could pass unseen")
    return problems


def _chunk_codecs(arr: zarr.Array) -> list[dict]:
    codecs = arr.metadata.to_dict().get("codecs", [])
    inner = []
    for codec in codecs:
        inner.append(codec)
        inner += list(codec.get("configuration", {}).get("codecs", []) or [])
    return inner


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def store_info(path: str | Path) -> dict:
    """Model, dims, dtype, N, arrays, truncated count, parts and size on disk."""
    store = FeatureStore.open(path)
    m = store.manifest
    stats = store.scan_texts(["n_tokens", "truncated"]).select(
        pl.col("truncated").sum().alias("trunc"), pl.col("n_tokens").mean().alias("mean")).collect()
    mean_tokens = stats["mean"].item()
    return {"path": str(store.path), "format_version": store.format_version,
            "model_id": m["model_id"], "pooling": m["pooling"],
            "layers": m["layers"], "max_length": m["max_length"], "dtype": m["dtype"],
            "dim": m["dim"], "n_texts": store.n_texts, "bytes_per_text": bytes_per_text(m),
            "arrays": {name: spec["path"] for name, spec in m["arrays"].items()},
            "n_parts": len(store.part_files()),
            "n_truncated": int(stats["trunc"].item() or 0),
            "mean_tokens": round(float(mean_tokens), 1) if mean_tokens is not None else 0.0,
            "size_bytes": _dir_size(store.path), "fingerprint": m["fingerprint"],
            "code_version": m["code_version"]}
