"""Synthetic tasks with a planted relation, for training tests (no store, no model)."""
from __future__ import annotations

import numpy as np
import torch

from headstore.heads.kinds import PairSet, Task
from headstore.heads.kinds.ranking import IRSplit


def planted_ir_task(n_docs: int = 400, dim: int = 16, seed: int = 0, noise: float = 0.05, signal: int = 4):
    """A query shares its relevant doc's first `signal` dims (plus noise); the other dims are loud
    independent noise. Raw cosine is dominated by the noise (near chance); a siamese head that learns
    to keep the signal dims ranks the right doc first. Returns (task, features (2 * n_docs, dim))."""
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n_docs, dim))
    docs[:, signal:] *= 3.0
    queries = 3.0 * rng.normal(size=(n_docs, dim))
    queries[:, :signal] = docs[:, :signal] + noise * rng.normal(size=(n_docs, signal))
    features = torch.tensor(np.concatenate([docs, queries]), dtype=torch.float32)  # rows: docs, then queries
    doc_rows = np.arange(n_docs)
    query_rows = n_docs + np.arange(n_docs)
    doc_ids = [f"d{i}" for i in range(n_docs)]
    order = rng.permutation(n_docs)
    n_test = n_docs // 5
    test, dev, train = order[:n_test], order[n_test:2 * n_test], order[2 * n_test:]

    def split(idx):
        return IRSplit([f"q{i}" for i in idx], query_rows[idx], doc_ids, doc_rows, {f"q{i}": {f"d{i}": 1} for i in idx})

    train_set = PairSet(query_rows[train], doc_rows[train])
    task = Task("planted", "ir", train_set, {"dev": split(dev), "test": split(test)}, "synthetic",
                doc_rows, set(zip(query_rows[train].tolist(), doc_rows[train].tolist())))
    return task, features


def planted_sts_task(n_pairs: int = 400, dim: int = 16, seed: int = 0):
    """Graded pairs whose score depends on a few planted dimensions only (the rest is noise)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n_pairs, dim))
    b = rng.normal(size=(n_pairs, dim))
    s = rng.uniform(0, 1, size=n_pairs)
    b[:, :4] = s[:, None] * a[:, :4] + (1 - s[:, None]) * b[:, :4]  # similar on dims 0-3 as s -> 1
    b[:, 4:] *= 3.0  # loud irrelevant dims swamp raw distances
    features = torch.tensor(np.concatenate([a, b]), dtype=torch.float32)
    rows_a, rows_b = np.arange(n_pairs), n_pairs + np.arange(n_pairs)
    idx = rng.permutation(n_pairs)
    parts = np.array_split(idx, [int(0.6 * n_pairs), int(0.8 * n_pairs)])
    sets = [PairSet(rows_a[p], rows_b[p], s[p].astype(np.float32)) for p in parts]
    return Task("planted-sts", "sts", sets[0], {"dev": sets[1], "test": sets[2]}, "synthetic"), features
