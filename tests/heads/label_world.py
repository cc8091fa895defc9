"""Labelled texts with planted classes, joined to an in-memory stand-in for a feature store."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from headstore.data.text_id import text_id


class MemoryStore:
    """What a task needs of a FeatureStore: the roles' prompts (none here), texts -> row ids -> rows."""

    prompts = {"query": "", "document": ""}

    def __init__(self, texts: list[str]):
        self.index = {text_id(t): i for i, t in enumerate(texts)}

    def row_ids(self, texts, role="document"):
        return [text_id(t) for t in texts]

    def rows_for(self, ids):
        return np.array([self.index[i] for i in ids], dtype=np.int64)

    def find_rows(self, ids):
        """FeatureStore.find_rows: each id's row, -1 where it is not stored."""
        return np.array([self.index.get(i, -1) for i in ids], dtype=np.int64)


def planted_labels(folder: Path, n: int = 480, n_classes: int = 6, dim: int = 16, seed: int = 0,
                   noise: float = 6.0) -> tuple[Path, MemoryStore, torch.Tensor]:
    """Classes `g{c // 3}.c{c}` (a two-level tree) whose means differ in 4 dims; the other dims are loud
    noise, so frozen k-NN is near chance while a head that keeps the 4 dims separates the classes.
    Rows: 2/3 train, 1/3 test. Returns (parquet path, store, features (n, dim))."""
    rng = np.random.default_rng(seed)
    classes = rng.integers(0, n_classes, n)
    means = rng.normal(size=(n_classes, 4))
    X = noise * rng.normal(size=(n, dim))
    X[:, :4] = means[classes] + 0.3 * rng.normal(size=(n, 4))
    texts = [f"text {i}" for i in range(n)]
    path = folder / "planted.parquet"
    pl.DataFrame({"text": texts, "label": [f"g{c // 3}.c{c}" for c in classes],
                  "split": np.where(np.arange(n) < 2 * n // 3, "train", "test")}).write_parquet(path)
    return path, MemoryStore(texts), torch.tensor(X, dtype=torch.float32)


def topic_texts(folder: Path, seed: int = 0, per_class: int = 24, topic_words: int = 6) -> tuple[Path, Path]:
    """Two labelled tables for a tiny BERT (words of tests/heads/finetune_world.WORDS):
    A: four classes, each text `topic_words` of its class's own group of words and the rest any
    word; B: other texts over all the words
    with random labels, whose training pulls an encoder away from A's structure."""
    import random

    from .finetune_world import WORDS

    rng = random.Random(seed)
    groups = [WORDS[i::4] for i in range(4)]
    n_train = 2 * per_class // 3
    rows_a = [{"text": " ".join([rng.choice(groups[c]) for _ in range(topic_words)]
                                + [rng.choice(WORDS) for _ in range(6 - topic_words)]) + f" {c}{i}",
               "label": f"topic{c}", "split": "train" if i < n_train else "test"}
              for c in range(4) for i in range(per_class)]
    rows_b = [{"text": " ".join(rng.choice(WORDS) for _ in range(6)) + f" {i} {i}",
               "label": f"noise{rng.randrange(4)}", "split": "train" if i < 4 * n_train else "test"}
              for i in range(4 * per_class)]
    paths = []
    for name, rows in (("A", rows_a), ("B", rows_b)):
        path = folder / f"topics-{name}.parquet"
        pl.DataFrame(rows).write_parquet(path)
        paths.append(path)
    return paths[0], paths[1]
