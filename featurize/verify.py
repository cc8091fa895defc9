"""`store verify` (integrity problems as a list) and `store info` (a summary) for a feature store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from headstore.data.text_id import text_ids as compute_text_ids
from headstore.featurize.store import FINGERPRINT_PARTS, MANIFEST, TEXTS, TEXTS_SCHEMA, fingerprint_of

BLOCK_ROWS = 65536  # rows checked at a time: bounded memory for large stores


def verify_store(path: str | Path) -> list[str]:
    """Every integrity problem found (empty list = the store is sound)."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        return [f"{path}: no {MANIFEST} (not a feature store, or its creation never finished)"]
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except json.JSONDecodeError as err:
        return [f"{path / MANIFEST}: not valid JSON ({err})"]
    problems = []
    missing = [k for k in (*FINGERPRINT_PARTS, "fingerprint", "arrays", "dim", "n_texts")
               if k not in manifest]
    if missing:
        return [f"{path / MANIFEST}: missing keys {missing}"]
    if fingerprint_of(manifest) != manifest["fingerprint"]:
        problems.append(f"{MANIFEST}: fingerprint does not match its parts (edited or corrupted)")
    try:
        texts = pl.read_parquet(path / TEXTS)
    except Exception as err:  # unreadable parquet: report, do not crash
        return problems + [f"{path / TEXTS}: cannot be read ({err})"]
    schema_diff = {k: str(v) for k, v in TEXTS_SCHEMA.items() if texts.schema.get(k) != v}
    if schema_diff:
        return problems + [f"{TEXTS}: columns missing or of the wrong type: {schema_diff}"]
    n = texts.height
    if manifest["n_texts"] != n:
        problems.append(f"{MANIFEST}: n_texts {manifest['n_texts']} but {TEXTS} has {n} rows "
                        "(an interrupted write: rerun featurize to complete it)")
    rows = np.sort(texts["row"].to_numpy())
    if not np.array_equal(rows, np.arange(n)):
        dup = texts.filter(pl.col("row").is_duplicated())["row"].unique().sort().head(5).to_list()
        problems.append(f"{TEXTS}: rows are not 0..{n - 1} exactly once (duplicated e.g. {dup}, "
                        f"min {rows.min() if n else None}, max {rows.max() if n else None})")
    n_dup = n - texts["text_id"].n_unique()
    if n_dup:
        problems.append(f"{TEXTS}: {n_dup} duplicated text_id(s)")
    bad = texts.filter(pl.Series(compute_text_ids(texts["text"].to_list())) != pl.col("text_id"))
    if bad.height:
        problems.append(f"{TEXTS}: {bad.height} text_id(s) do not match hash(text), "
                        f"e.g. row {bad['row'][0]}")
    for name, spec in manifest["arrays"].items():
        problems += _verify_array(path / spec["path"], name, n, manifest)
    return problems


def _verify_array(array_path: Path, name: str, n: int, manifest: dict) -> list[str]:
    try:
        arr = zarr.open_array(array_path, mode="r")
    except Exception as err:
        return [f"{name}: cannot open {array_path} ({err})"]
    problems = []
    if arr.shape != (n, manifest["dim"]):
        problems.append(f"{name}: shape {arr.shape}, expected ({n}, {manifest['dim']})")
    if str(arr.dtype) != manifest["dtype"]:
        problems.append(f"{name}: dtype {arr.dtype}, manifest says {manifest['dtype']}")
    n_bad = 0
    first_bad = None
    try:
        for start in range(0, min(n, arr.shape[0]), BLOCK_ROWS):
            block = arr[start: start + BLOCK_ROWS]
            finite = np.isfinite(block).all(axis=1)
            if not finite.all():
                n_bad += int((~finite).sum())
                first_bad = first_bad if first_bad is not None else start + int(np.argmin(finite))
    except Exception as err:  # a truncated/garbled shard file
        problems.append(f"{name}: cannot read data ({type(err).__name__}: {err})")
    if n_bad:
        problems.append(f"{name}: {n_bad} row(s) with NaN/inf, first at row {first_bad}")
    return problems


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def store_info(path: str | Path) -> dict:
    """Model, dims, dtype, N, arrays, truncated count and size on disk."""
    from headstore.featurize.store import FeatureStore

    store = FeatureStore.open(path)
    m = store.manifest
    texts = store.texts
    return {"path": str(store.path), "model_id": m["model_id"], "pooling": m["pooling"],
            "layers": m["layers"], "max_length": m["max_length"], "dtype": m["dtype"],
            "dim": m["dim"], "n_texts": store.n_texts,
            "arrays": {name: spec["path"] for name, spec in m["arrays"].items()},
            "n_truncated": int(texts["truncated"].sum()),
            "mean_tokens": round(float(texts["n_tokens"].mean()), 1) if texts.height else 0.0,
            "size_bytes": _dir_size(store.path), "fingerprint": m["fingerprint"],
            "code_version": m["code_version"]}
