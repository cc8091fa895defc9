"""The features of the store rows a task uses, and nothing else: memory set by the task, not by the store.

A task (heads.kinds) holds store row numbers. `TaskFeatures` reads the sorted unique rows a task needs
(its texts, its corpus, out-of-domain sets, an anchor set) from the store's Zarr array
(`FeatureStore.features(rows)` reads only the chunks holding them) into a dense (n, D) float32 matrix,
and `remap` rewrites the task's row numbers once into positions of that matrix. Positions keep the order
of store rows (the rows are sorted), so every ranking, tie-break and mined negative is what it is over the
whole store: the numbers do not change, only the memory (peak RSS ~ a fixed overhead + n * D * 4 bytes).

`rows=None` keeps every store row (positions = store rows).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

from headstore.heads.network.features import read_features
from headstore.heads.kinds import Task, load_task, task_rows

# dataclass fields of tasks and their evaluation / training sets that hold store rows (heads.kinds):
# PairSet / TrainSet anchor, positive, negative; IRSplit query_rows, doc_rows; LabelSplit rows; Task corpus_rows
ROW_FIELDS = frozenset({"anchor", "positive", "negative", "query_rows", "doc_rows", "rows", "corpus_rows"})


def row_arrays(obj) -> Iterator[np.ndarray]:
    """Every array of store rows in `obj` (a task, an evaluation set, a dict of them), found the way `remap`
    finds the rows it rewrites: the fields named in ROW_FIELDS and the `relevant` pairs, at any depth."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from row_arrays(v)
        return
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None:
            continue
        if f.name in ROW_FIELDS and isinstance(value, np.ndarray):
            yield value.ravel()
        elif f.name == "relevant" and isinstance(value, set):
            yield np.fromiter((r for pair in value for r in pair), dtype=np.int64, count=2 * len(value))
        elif dataclasses.is_dataclass(value) or isinstance(value, dict):
            yield from row_arrays(value)


def rows_of(task: Task) -> np.ndarray:
    """Every store row a task uses (sorted, unique): its training and evaluation sets with their given
    negatives, its corpus (mining), its known relevant pairs and, for labelled texts, the pool and labelled
    reference set. Collected by the walk `remap` makes, so every row `remap` rewrites is among them."""
    parts = [np.fromiter(task_rows(task), dtype=np.int64)]
    parts += [np.asarray(a, dtype=np.int64) for a in row_arrays(task)]
    return np.unique(np.concatenate(parts))


def rows_of_datasets(store, paths: Iterable[str]) -> np.ndarray:
    """Every store row the evaluation sets of `paths` use (out-of-domain selection or transfer sets)."""
    parts = [rows_of(load_task(p, store, for_eval=True)) for p in paths]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


class TaskFeatures:
    """Sorted unique store rows -> a dense (n, D) float32 matrix per array, and the row -> position map."""

    def __init__(self, store, rows: Optional[np.ndarray], device: str | torch.device = "cpu"):
        self.store, self.device = store, torch.device(device)  # where the matrix is held (heads train there)
        self.rows = None if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
        self._arrays: dict[str, torch.Tensor] = {}

    @classmethod
    def for_task(cls, store, task: Task, *extra: Optional[np.ndarray], device: str | torch.device = "cpu") -> "TaskFeatures":
        """The rows of `task` and of every `extra` row array; an extra of None means every store row."""
        if any(e is None for e in extra):
            return cls(store, None, device)
        return cls(store, np.concatenate([rows_of(task), *[np.asarray(e, dtype=np.int64) for e in extra]]), device)

    def __len__(self) -> int:
        return self.store.n_texts if self.rows is None else len(self.rows)

    def read(self, array: str = "features") -> torch.Tensor:
        """(n, D) float32 features of the rows (for 'a+b' arrays side by side), read once per array, on the
        device given (a GPU holds them in its memory: a 1M x 384 task, 1.5 GB)."""
        if array not in self._arrays:
            x = read_features(self.store, array) if self.rows is None else read_features(self.store, array, self.rows)
            self._arrays[array] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)
        return self._arrays[array]

    def positions(self, rows) -> np.ndarray:
        """Positions in the matrix of store rows `rows` (any shape)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.rows is None:
            return rows
        pos = np.searchsorted(self.rows, rows)
        found = (pos < len(self.rows)) & (self.rows[np.minimum(pos, len(self.rows) - 1)] == rows)
        if not found.all():  # a check, not an assert: under `python -O` a row would silently become another
            raise LookupError(f"store rows {np.unique(rows[~found])[:5].tolist()} are not among the {len(self.rows)} "
                              "rows read for the task (a task field holding rows that rows_of does not collect)")
        return pos

    def remap(self, obj):
        """`obj` (a task, an evaluation set, a dict of them) with every store row replaced by its position."""
        if self.rows is None:
            return obj
        if isinstance(obj, dict):
            return {k: self.remap(v) for k, v in obj.items()}
        if not dataclasses.is_dataclass(obj):
            return obj
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None:
                continue
            if f.name in ROW_FIELDS and isinstance(value, np.ndarray):
                changes[f.name] = self.positions(value)
            elif f.name == "relevant" and isinstance(value, set):
                changes[f.name] = {(int(a), int(p)) for a, p in zip(
                    self.positions([a for a, _ in value]), self.positions([p for _, p in value]))}
            elif dataclasses.is_dataclass(value) or isinstance(value, dict):
                changes[f.name] = self.remap(value)
        return dataclasses.replace(obj, **changes)
