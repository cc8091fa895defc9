"""Reading a feature store (its layout: layout.py): `FeatureStore`, the texts, the features of any rows, the
text-id index; every read checked against what the manifest committed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from headstore.data.text_id import ROLES, TEXT_ID_BYTES, row_ids
from headstore.featurize.store.ids import IdSet, SortedIds, keys_of_hex
from headstore.featurize.store.layout import (LEGACY_TEXTS, PLAIN_ID, TEXTS_SCHEMA, StoreError, check_part,
                                              format_version, read_manifest, shard_file, shard_rows_of)
from headstore.featurize.store.rows import read_rows

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


def stored_ids(store: FeatureStore) -> IdSet:
    """An IdSet of every committed text id (read part by part: text_id column only)."""
    ids = IdSet()
    for file in store.checked_part_files():
        ids.add(keys_of_hex(pl.read_parquet(file, columns=["text_id"])["text_id"]))
    return ids
