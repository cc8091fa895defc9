"""The feature store's layout on disk: its file names, the manifest (read, checked, fingerprinted), its parts and
shard files. One directory that plain zarr / polars / json can read.

Layout of a store S (format 2, an append-only segment store):
    S/manifest.json            the commit record: format_version, fingerprint and its parts, arrays,
                               dim, n_texts, and the committed texts parts (path, rows, size, sha256)
    S/texts/part-000000.parquet  text_id, text, row, n_tokens, truncated -- one part per commit
    S/features.zarr            Zarr v3 array (N, D), float16 or float32, chunked and sharded, every
                               chunk carrying a crc32c checksum (zarr's crc32c codec)
    S/features_layer-4.zarr    one sibling array per extra layer (named in the manifest)
    S/tap_mlp_3.zarr           with --taps: one array per tap and layer, its own width (featurize.encoder.taps)
    S/.lock                    held by the one writer (the OS drops it when the writer dies)

Commit protocol (writer.py; what makes a SIGKILL at any moment safe): features of the new rows
[n, m) are written to the arrays, their shard files and folders fsynced; the new texts part is
written and fsynced; then manifest.json is replaced atomically (temp + fsync + rename): that is the
commit point. Nothing is ever rewritten in proportion to the store: a commit writes its rows' shard
files (at most one shard of old rows), one new part, and the manifest (a line per part; `cli store
compact` merges parts). Readers see only what the manifest lists: rows past n_texts in the arrays and
parts not listed are an interrupted commit's leftovers, removed by the next writer.

Format 1 (a single texts.parquet, no format_version, arrays without checksums) is still read; a
writer refuses it until `cli store migrate S` converts it (maintain.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import zarr

from headstore.data.text_id import TEXT_ID_BYTES
from headstore.featurize.encoder.taps import tap_arrays

MANIFEST = "manifest.json"
TEXTS_DIR = "texts"
LEGACY_TEXTS = "texts.parquet"  # format 1
LOCK = ".lock"
FORMAT_VERSION = 2
FINGERPRINT_PARTS = ("model_id", "weights_hash", "tokenizer_hash", "pooling", "layers",
                     "max_length", "dtype", "precision", "code_version")
# parts present only where they differ from what stores had before them (so those stores keep their
# fingerprint): the model's sentence modules (featurize.encoder.sentence), the roles' prompts, the encoder's
# numerics where the weights are held in half precision (config.FINGERPRINTED_NUMERICS), the taps (featurize.
# encoder.taps: their kinds, pooling and widths), and a CPU runtime out of fp32 (featurize.encoder.backends.backend_part; fp32 stores made while every runtime was a part keep it)
OPTIONAL_PARTS = ("include_prompt", "dense", "normalize", "prompts", "numerics", "backend", "taps")
TEXTS_SCHEMA = {"text_id": pl.String, "text": pl.String, "row": pl.Int64,
                "n_tokens": pl.Int32, "truncated": pl.Boolean}
PLAIN_ID = f"^[0-9a-fA-F]{{{2 * TEXT_ID_BYTES}}}$"  # a text id as stored (hex of 16 bytes)


class StoreError(ValueError):
    """A store that cannot be used as asked (fingerprint mismatch, missing, locked, corrupted)."""


def fingerprint_of(parts: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of the fingerprint parts."""
    chosen = {k: parts[k] for k in FINGERPRINT_PARTS} | {k: parts[k] for k in OPTIONAL_PARTS if k in parts}
    canonical = json.dumps(chosen, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def normalized_arrays(manifest: dict) -> set[str]:
    """The arrays of a store read through the model's Normalize."""
    return {name for name, info in manifest.get("arrays", {}).items() if isinstance(info, dict) and info.get("normalize")}


def array_names(layers: Sequence[int]) -> dict[str, int]:
    """The first listed layer is `features`; every other one `features_layer{L}`."""
    return {("features" if i == 0 else f"features_layer{layer}"): layer
            for i, layer in enumerate(layers)}


def store_arrays(parts: dict) -> dict[str, dict]:
    """Every array a store of these fingerprint parts holds, in the order a batch's features come: the layers'
    ({"layer": L}, the store's dim), then the taps' ({"tap": kind, "layer": i, "dim": their width})."""
    return {**{name: {"layer": layer} for name, layer in array_names(parts["layers"]).items()},
            **tap_arrays(parts.get("taps"))}


def array_dim(manifest: dict, name: str) -> int:
    """The width of array `name`: its own (a tap's), else the store's dim."""
    return int(manifest["arrays"][name].get("dim", manifest["dim"]))


def bytes_per_text(manifest: dict) -> dict[str, int]:
    """Feature bytes a text takes in a store (a manifest, or fingerprint parts with its dim): {"features": the
    layers' arrays, "taps": the taps', "total"}."""
    itemsize = 2 if manifest["dtype"] == "float16" else 4
    arrays = manifest.get("arrays") or store_arrays(manifest)
    taps = sum(int(a.get("dim", manifest["dim"])) for a in arrays.values() if "tap" in a) * itemsize
    total = sum(int(a.get("dim", manifest["dim"])) for a in arrays.values()) * itemsize
    return {"features": total - taps, "taps": taps, "total": total}


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


def read_manifest(path: Path) -> dict:
    """The manifest as a dict; StoreError naming the file when absent or not JSON."""
    file = path / MANIFEST
    if not file.is_file():
        raise StoreError(f"{path}: not a feature store (no {MANIFEST}); give the directory "
                         "`cli featurize --store` wrote")
    try:
        manifest = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise StoreError(f"{file}: not valid JSON ({err}); the store is corrupted "
                         f"(run `cli store verify {path}`)") from None
    if not isinstance(manifest, dict) or "fingerprint" not in manifest or "arrays" not in manifest:
        raise StoreError(f"{file}: not a feature store manifest (no fingerprint/arrays)")
    version = manifest.get("format_version", 1)
    if version not in (1, FORMAT_VERSION):
        raise StoreError(f"{file}: store format {version}; this headstore reads formats 1 and "
                         f"{FORMAT_VERSION} (upgrade headstore)")
    return manifest


def check_part(path: Path, part: dict, content: bool = True) -> Path:
    """The file of a committed texts part (a manifest entry of store `path`); StoreError naming it
    when it is missing, of another size or (content=True: one pass over the file) of another
    sha256 than the one committed."""
    file = path / part["path"]
    size = file.stat().st_size if file.is_file() else None
    if size != part["bytes"]:
        what = "is missing" if size is None else f"has {size} bytes, the manifest says {part['bytes']}"
        raise StoreError(f"{file}: {what} (truncated or replaced); the store is corrupted "
                         f"(run `cli store verify {path}`)")
    if content:
        with open(file, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != part["sha256"]:
            raise StoreError(f"{file}: sha256 differs from the one committed (overwritten or "
                             f"edited); the store is corrupted (run `cli store verify {path}`; "
                             "featurize the texts again into a new store)")
    return file


def format_version(manifest: dict) -> int:
    return int(manifest.get("format_version", 1))


def shard_file(array_path: Path, arr: zarr.Array, shard: int) -> Path:
    """The file holding shard `shard` (rows [shard * shard_rows, ...)) of a 2-D sharded array."""
    return array_path / arr.metadata.chunk_key_encoding.encode_chunk_key((shard, 0))


def shard_rows_of(arr: zarr.Array) -> int:
    return int((arr.shards or arr.chunks)[0])


def segment_backends(manifest: dict) -> dict[str, int]:
    """Committed rows per backend that encoded them (featurize.encoder.backends): each part's `backend`; a part committed
    before parts recorded it has the store's fingerprint part (a store of one runtime), else torch."""
    rows: dict[str, int] = {}
    for part in manifest.get("parts", []):
        backend = part.get("backend") or manifest.get("backend") or "torch"
        rows[backend] = rows.get(backend, 0) + int(part["n_rows"])
    return rows


def legacy_backend_matches(manifest: dict, parts: dict) -> bool:
    """An fp32 store made while every CPU runtime was a fingerprint part (`backend` in its manifest) whose
    fingerprint is this run's plus that part: the runtime was provably within 1e-5 of torch, so the store is
    accepted as it is (its fingerprint kept: the heads trained on it stay valid) and takes texts from any backend."""
    legacy = manifest.get("backend")
    return (legacy is not None and "backend" not in parts and manifest.get("precision") == "fp32"
            and parts.get("precision") == "fp32"
            and manifest["fingerprint"] == fingerprint_of({**parts, "backend": legacy}))


def check_fingerprint(path: Path, manifest: dict, parts: dict) -> None:
    """StoreError naming every differing part when the store was made with other settings."""
    if manifest["fingerprint"] == fingerprint_of(parts) or legacy_backend_matches(manifest, parts):
        return
    diffs = [f"{k}: store has {manifest.get(k)!r}, this run has {parts.get(k)!r}"
             for k in (*FINGERPRINT_PARTS, *OPTIONAL_PARTS) if manifest.get(k) != parts.get(k)]
    hint = ""
    if {d.split(":")[0] for d in diffs} == {"normalize"} and manifest.get("pooling") == "mean":
        hint = ("\nthe store holds this model's mean-pooled features from before --pooling model applied its "
                f"Normalize: `cli store migrate {path}` records the Normalize (no encoding), or give --pooling mean")
    raise StoreError(f"{path}: fingerprint mismatch, refusing to mix features; differing parts:\n  "
                     + "\n  ".join(diffs or ["(manifest parts do not hash to its fingerprint)"])
                     + (hint or "\nuse another --store, or the store's settings"))
