"""The feature store: one directory that plain zarr / polars / json can read.

Layout of a store S (format 2, an append-only segment store):
    S/manifest.json            the commit record: format_version, fingerprint and its parts, arrays,
                               dim, n_texts, and the committed texts parts (path, rows, size, sha256)
    S/texts/part-000000.parquet  text_id, text, row, n_tokens, truncated -- one part per commit
    S/features.zarr            Zarr v3 array (N, D), float16 or float32, chunked and sharded, every
                               chunk carrying a crc32c checksum (zarr's crc32c codec)
    S/features_layer-4.zarr    one sibling array per extra layer (named in the manifest)
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

import numpy as np
import polars as pl
import zarr

from headstore.data.text_id import ROLES, TEXT_ID_BYTES, row_ids
from headstore.featurize.ids import IdSet, SortedIds, keys_of_hex
from headstore.featurize.rows import read_rows

MANIFEST = "manifest.json"
TEXTS_DIR = "texts"
LEGACY_TEXTS = "texts.parquet"  # format 1
LOCK = ".lock"
FORMAT_VERSION = 2
FINGERPRINT_PARTS = ("model_id", "weights_hash", "tokenizer_hash", "pooling", "layers",
                     "max_length", "dtype", "precision", "code_version")
# parts present only where they differ from what stores had before them (so those stores keep their
# fingerprint): the model's sentence modules (featurize.sentence), the roles' prompts, the encoder's
# numerics where the weights are held in half precision (config.FINGERPRINTED_NUMERICS), and a CPU runtime
# out of fp32 (featurize.backends.backend_part; fp32 stores made while every runtime was a part keep it)
OPTIONAL_PARTS = ("include_prompt", "dense", "normalize", "prompts", "numerics", "backend")
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


class FeatureStore:
    """Read access to a store. Open with `FeatureStore.open(path)`; never writes."""

    def __init__(self, path: Path, manifest: dict, texts: pl.DataFrame | None = None):
        self.path = path
        self.manifest = manifest
        self._texts = texts
        self._index = None  # SortedIds of text ids -> rows, built on the first rows_for
        self._checked: set[str] = set()  # parts whose sha256 was checked (once per FeatureStore)

    @classmethod
    def open(cls, path: str | Path) -> "FeatureStore":
        path = Path(path)
        manifest = read_manifest(path)
        if format_version(manifest) == 1:
            legacy = path / LEGACY_TEXTS
            try:
                texts = pl.read_parquet(legacy).sort("row")
            except Exception as err:
                raise StoreError(f"{legacy}: cannot be read ({err}); the store is corrupted "
                                 f"(run `cli store verify {path}`)") from None
            return cls(path, manifest, texts)
        for part in manifest["parts"]:
            check_part(path, part, content=False)
        return cls(path, manifest)

    @property
    def format_version(self) -> int:
        return format_version(self.manifest)

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def arrays(self) -> list[str]:
        return list(self.manifest["arrays"])

    @property
    def prompts(self) -> dict[str, str]:
        """The prompt of each role (data.text_id.ROLES) the store's texts were encoded under ("" for none)."""
        given = self.manifest.get("prompts") or {}
        return {role: given.get(role, "") for role in ROLES}

    def row_ids(self, texts: Sequence[str], role: str = "document") -> list[str]:
        """The row ids of `texts` in `role`: the key of each under the store's prompt of that role."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}; valid: {list(ROLES)}")
        return row_ids(list(texts), self.prompts[role])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def n_texts(self) -> int:
        if self.format_version == 1:
            return self.texts.height  # the committed rows (the manifest may lag after a crash)
        return int(self.manifest["n_texts"])

    def part_files(self) -> list[Path]:
        """The committed texts parts, in row order (format 1: the one texts.parquet)."""
        if self.format_version == 1:
            return [self.path / LEGACY_TEXTS]
        return [self.path / p["path"] for p in self.manifest["parts"]]

    def checked_part_files(self) -> list[Path]:
        """part_files(), each checked against its committed sha256 on its first read (StoreError
        naming the file): a part overwritten with other bytes of the same size is refused here,
        not deep inside polars. Format 1 records no checksum."""
        if self.format_version == 1:
            return self.part_files()
        for part in self.manifest["parts"]:
            if part["path"] not in self._checked:
                check_part(self.path, part)
                self._checked.add(part["path"])
        return self.part_files()

    def scan_texts(self, columns: Sequence[str] | None = None) -> pl.LazyFrame:
        """The committed rows as a lazy frame (concatenated parts, row order)."""
        columns = list(columns or TEXTS_SCHEMA)
        if self._texts is not None:
            return self._texts.lazy().select(columns)
        files = self.checked_part_files()
        if not files:
            return pl.DataFrame(schema=TEXTS_SCHEMA).lazy().select(columns)
        return pl.scan_parquet([str(f) for f in files]).select(columns)

    @property
    def texts(self) -> pl.DataFrame:
        """Every committed row (text_id, text, row, n_tokens, truncated), sorted by row."""
        if self._texts is None:
            scan = self.scan_texts()  # a part that fails its sha256 is named here
            try:
                self._texts = scan.collect().cast(TEXTS_SCHEMA)
            except Exception as err:
                raise StoreError(f"{self.path}: a texts part cannot be read ({err}); "
                                 f"run `cli store verify {self.path}`") from None
        return self._texts

    def array(self, name: str = "features") -> zarr.Array:
        if name not in self.manifest["arrays"]:
            raise KeyError(f"{self.path}: no array {name!r}; arrays: {self.arrays}")
        return zarr.open_array(self.path / self.manifest["arrays"][name]["path"], mode="r")

    def features(self, rows: Sequence[int] | np.ndarray | None = None,
                 array: str = "features") -> np.ndarray:
        """Features of the given rows (default: every committed row) as float32 (len, D).

        Reads only the chunks holding those rows. StoreError naming the file when a shard file
        is missing or fails its checksum, and naming the rows when a feature is NaN/inf.
        `features("features_layer-4")` (an array name first, as before rows existed) still works.
        """
        if isinstance(rows, str):
            rows, array = None, rows
        arr = self.array(array)
        array_path = self.path / self.manifest["arrays"][array]["path"]
        n = self.n_texts
        if arr.shape[0] < n:
            raise StoreError(f"{array_path}: {arr.shape[0]} rows but the store has {n} committed "
                             f"(corrupted; run `cli store verify {self.path}`)")
        if rows is None:
            wanted = np.arange(n, dtype=np.int64)
        else:
            wanted = np.asarray(rows, dtype=np.int64).reshape(-1)
            if len(wanted) and (wanted.min() < 0 or wanted.max() >= n):
                bad = wanted[(wanted < 0) | (wanted >= n)][0]
                raise IndexError(f"{self.path}: row {bad} out of range (the store has {n} rows)")
        step = shard_rows_of(arr)
        for shard in np.unique(wanted // step) if len(wanted) else []:
            file = shard_file(array_path, arr, int(shard))
            if not file.is_file():
                raise StoreError(f"{file}: shard file missing (rows {shard * step}.."
                                 f"{min(n, (shard + 1) * step) - 1} of {array}); the store is "
                                 f"corrupted (run `cli store verify {self.path}`)")
        unique = wanted if rows is None else np.unique(wanted)
        try:
            out = read_rows(arr, unique, n, bool(self.manifest["arrays"][array].get("normalize")))
        except Exception as err:
            raise StoreError(self._which_shard_failed(arr, array_path, wanted, err)) from None
        if len(unique) != len(wanted) or not np.array_equal(unique, wanted):
            out = out[np.searchsorted(unique, wanted)]  # the order (and repeats) asked for
        finite = finite_rows(out)
        if not finite.all():
            bad_rows = wanted[~finite]
            raise StoreError(f"{array_path}: row(s) {', '.join(map(str, bad_rows[:5].tolist()))}"
                             f"{' ...' if len(bad_rows) > 5 else ''} ({len(bad_rows)} in all) hold "
                             f"NaN/inf features; the store is corrupted (run `cli store verify "
                             f"{self.path}`; featurize again into a new store)")
        return out

    def _which_shard_failed(self, arr, array_path: Path, wanted: np.ndarray, err: Exception) -> str:
        step = shard_rows_of(arr)
        for shard in np.unique(wanted // step):
            start = int(shard) * step
            try:
                arr[start: min(start + step, self.n_texts)]
            except Exception as shard_err:
                return (f"{shard_file(array_path, arr, int(shard))}: cannot be read "
                        f"({type(shard_err).__name__}: {shard_err}); checksum mismatch or damaged "
                        f"file: the store is corrupted (run `cli store verify {self.path}`)")
        return f"{array_path}: cannot be read ({type(err).__name__}: {err})"

    def find_rows(self, text_ids: Sequence[str]) -> np.ndarray:
        """Row of each text_id (int64), -1 where it is not stored (or is no 32-hex-character id).

        The one text-id index of a store: built on first use from the text_id and row columns only
        (16 bytes + a row per text, ids.SortedIds), then reused by every lookup."""
        if self._index is None:
            frame = self.scan_texts(["text_id", "row"]).collect()
            self._index = SortedIds(keys_of_hex(frame["text_id"]), frame["row"].to_numpy())
        text_ids = list(text_ids)
        hexes = pl.Series(text_ids, dtype=pl.String)
        if not hexes.str.contains(PLAIN_ID).all():  # rare: spaces in ids, or not ids at all
            hexes = pl.Series([_id_hex(t) for t in text_ids], dtype=pl.String)  # None: not an id
        rows = np.full(len(text_ids), -1, dtype=np.int64)
        valid = np.flatnonzero(hexes.is_not_null().to_numpy())
        if len(valid):
            found = self._index.find(keys_of_hex(hexes.gather(valid)))
            hit = found >= 0
            rows[valid[hit]] = self._index.values[found[hit]]
        return rows

    def rows_for(self, text_ids: Sequence[str]) -> np.ndarray:
        """Row of each text_id (int64); KeyError naming the first text that is not stored (a
        malformed id first: it cannot be stored)."""
        text_ids = list(text_ids)
        rows = self.find_rows(text_ids)
        if (rows < 0).any():
            malformed = [t for t in text_ids if _id_hex(t) is None]
            missing = malformed[0] if malformed else text_ids[int(np.argmax(rows < 0))]
            raise KeyError(f"{self.path}: text_id {missing} is not in the store; "
                           "featurize the dataset into it first")
        return rows


FINITE_BLOCK = 1 << 16  # rows checked for NaN/inf at a time: a (rows, D) mask of 3M x 384 at once is 1.2 GB


def finite_rows(x: np.ndarray) -> np.ndarray:
    """(n,) bool: the rows of x (n, D) holding no NaN/inf, FINITE_BLOCK rows at a time (the read's peak memory
    stays the features')."""
    ok = np.ones(len(x), dtype=bool)
    for s in range(0, len(x), FINITE_BLOCK):
        ok[s:s + FINITE_BLOCK] = np.isfinite(x[s:s + FINITE_BLOCK]).all(axis=1)
    return ok


def _id_hex(text_id: str) -> str | None:
    """The 32 hex characters of a 16-byte text id (case and spaces as bytes.fromhex takes them),
    None for anything else: such an id cannot be stored."""
    try:
        raw = bytes.fromhex(text_id)
    except ValueError:
        return None
    return raw.hex() if len(raw) == TEXT_ID_BYTES else None


def segment_backends(manifest: dict) -> dict[str, int]:
    """Committed rows per backend that encoded them (featurize.backends): each part's `backend`; a part committed
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


def stored_ids(store: FeatureStore) -> IdSet:
    """An IdSet of every committed text id (read part by part: text_id column only)."""
    ids = IdSet()
    for file in store.checked_part_files():
        ids.add(keys_of_hex(pl.read_parquet(file, columns=["text_id"])["text_id"]))
    return ids
