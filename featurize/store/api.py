"""`headstore.Store`: the public, read-only view of a feature store.

    store = headstore.Store.open("runs/store-minilm")
    rows = store.rows_for(["a text", "another text"])   # texts or their text_ids
    X = store.features(rows)                             # (2, D) float32, only those rows read

It wraps `featurize.store.reader.FeatureStore` (the layout and commit protocol live there) and adds what a
user outside the CLI needs: rows looked up by text or by text_id, and row subsets read without
loading the whole array.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from headstore.featurize.store.reader import FeatureStore

TEXT_ID = re.compile(r"[0-9a-f]{32}")  # data.text_id: 16 bytes of blake2b, hex


class Store:
    """Read access to a feature store: `.texts`, `.features(rows)`, `.rows_for(texts_or_ids)`, `.fingerprint`."""

    def __init__(self, store: FeatureStore):
        self._store = store

    @classmethod
    def open(cls, path: str | Path) -> "Store":
        """Open the store at `path` (a `cli featurize --store` directory); StoreError if it is not one."""
        return cls(FeatureStore.open(path))

    @property
    def feature_store(self) -> FeatureStore:
        """The underlying FeatureStore (what the library's training and evaluation code take)."""
        return self._store

    @property
    def path(self) -> Path:
        return self._store.path

    @property
    def texts(self) -> pl.DataFrame:
        """One row per stored text: text_id, text, row, n_tokens, truncated (sorted by row)."""
        return self._store.texts

    @property
    def fingerprint(self) -> str:
        """sha256 of everything that shaped the numbers (model, tokenizer, pooling, layers, ...)."""
        return self._store.fingerprint

    @property
    def manifest(self) -> dict:
        return self._store.manifest

    @property
    def arrays(self) -> list[str]:
        return self._store.arrays

    @property
    def dim(self) -> int:
        return self._store.dim

    def __len__(self) -> int:
        return self._store.n_texts

    def __repr__(self) -> str:
        return (f"Store({str(self.path)!r}, {len(self)} texts, dim {self.dim}, "
                f"model {self.manifest.get('model_id')!r}, arrays {self.arrays})")

    def features(self, rows: Sequence[int] | np.ndarray | None = None, array: str = "features") -> np.ndarray:
        """Float32 features: all committed rows (N, D), or the given rows in the given order (n, D).

        Only the chunks holding the asked rows are read; a row outside [0, N) is an IndexError."""
        if rows is None:
            return self._store.features(array)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)  # (n,)
        n = self._store.n_texts
        bad = rows[(rows < 0) | (rows >= n)]
        if bad.size:
            raise IndexError(f"{self.path}: row {int(bad[0])} is out of range; the store holds rows 0..{n - 1}")
        if "rows" in inspect.signature(self._store.features).parameters:  # the store reads subsets itself
            return np.asarray(self._store.features(array=array, rows=rows), dtype=np.float32)
        if rows.size == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique, inverse = np.unique(rows, return_inverse=True)  # sorted reads, each row once
        block = self._store.array(array).get_orthogonal_selection((unique, slice(None)))  # (u, D)
        return np.asarray(block, dtype=np.float32)[inverse]

    @property
    def prompts(self) -> dict[str, str]:
        """The prompt of each role ("query", "document") the store's texts were encoded under ("" for none)."""
        return self._store.prompts

    def rows_for(self, texts_or_ids: Sequence[str] | str, role: str = "document") -> np.ndarray:
        """Store row (int64) of each item: a stored row id is taken as is, anything else is a text of `role`
        (hashed as `cli featurize` hashed it, under the store's prompt of that role; IR documents were stored
        as `title + " " + text`). KeyError naming the first item that is not in the store."""
        if isinstance(texts_or_ids, str):
            texts_or_ids = [texts_or_ids]
        items = list(texts_or_ids)
        # the store's one text-id index: an item that is a stored text_id keeps its row, the rest hash
        rows = np.full(len(items), -1, dtype=np.int64)
        as_id = np.flatnonzero([TEXT_ID.fullmatch(t) is not None for t in items])
        if as_id.size:
            rows[as_id] = self._store.find_rows([items[i] for i in as_id])
        as_text = np.flatnonzero(rows < 0)
        if as_text.size:
            rows[as_text] = self._store.find_rows(self._store.row_ids([items[i] for i in as_text], role))
        missing = [items[i] for i in np.flatnonzero(rows < 0)]
        if missing:
            shown = missing[0] if len(missing[0]) <= 80 else missing[0][:77] + "..."
            raise KeyError(f"{self.path}: {len(missing)} of {len(items)} texts are not in the store, "
                           f"first: {shown!r}; featurize them into it first (cli featurize)")
        return rows
