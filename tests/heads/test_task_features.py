"""Memory set by the task (heads.artefacts.task_features): a task reads only its own rows of a store holding many
more, and trains and evaluates to the same numbers as on the whole store's features."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.evaluation.evaluate import evaluate_head
from headstore.heads.kinds import task_rows
from headstore.heads.artefacts.task_features import TaskFeatures, rows_of
from headstore.heads.training.train import train_stack

from .synthetic import planted_ir_task


class RecordingStore:
    """A store of `features` that records the rows each read asked for (None: every row)."""

    def __init__(self, features: np.ndarray):
        self.x, self.reads = features, []

    @property
    def n_texts(self) -> int:
        return len(self.x)

    def features(self, rows=None, array="features"):
        if isinstance(rows, str):  # features("array"): every row of that array
            rows = None
        self.reads.append(None if rows is None else np.asarray(rows).copy())
        return self.x if rows is None else self.x[np.asarray(rows)]


def spread_task(extra: int = 700, seed: int = 1):
    """The planted IR task with its rows scattered among `extra` unrelated store rows (before, between, after)."""
    task, feats = planted_ir_task(n_docs=120, dim=8, seed=0)
    rng = np.random.default_rng(seed)
    n = len(feats) + extra
    where = np.sort(rng.choice(n, size=len(feats), replace=False))  # old row i -> store row where[i]
    store_x = rng.normal(size=(n, feats.shape[1])).astype(np.float32) * 5
    store_x[where] = feats.numpy()
    return _move(task, where), store_x


def _move(task, where):
    """The task with every row r replaced by where[r] (a remap in the other direction, by a loop)."""
    def move(obj):
        if isinstance(obj, dict):
            return {k: move(v) for k, v in obj.items()}
        if not dataclasses.is_dataclass(obj):
            return obj
        ch = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name in ("anchor", "positive", "query_rows", "doc_rows", "corpus_rows") and v is not None:
                ch[f.name] = np.array([where[int(r)] for r in v], dtype=np.int64)
            elif f.name == "relevant":
                ch[f.name] = {(int(where[a]), int(where[p])) for a, p in v}
            elif dataclasses.is_dataclass(v) or isinstance(v, dict):
                ch[f.name] = move(v)
        return dataclasses.replace(obj, **ch)

    return move(task)


def test_reads_only_the_task_rows():
    task, store_x = spread_task()
    store = RecordingStore(store_x)
    tf = TaskFeatures.for_task(store, task)
    X = tf.read()
    assert len(store.reads) == 1 and store.reads[0] is not None
    want = np.unique(np.concatenate([np.fromiter(task_rows(task), dtype=np.int64), task.corpus_rows]))
    assert np.array_equal(np.unique(store.reads[0]), want)
    assert X.shape == (len(want), store_x.shape[1]) and len(want) < len(store_x) - 600
    assert np.array_equal(rows_of(task), want)
    small = tf.remap(task)  # every row of the remapped task points at the same feature vector
    for split in ("dev", "test"):
        a, b = task.eval_sets[split], small.eval_sets[split]
        assert torch.equal(X[b.query_rows], torch.from_numpy(store_x[a.query_rows]))
        assert torch.equal(X[b.doc_rows], torch.from_numpy(store_x[a.doc_rows]))
    assert torch.equal(X[small.train.anchor], torch.from_numpy(store_x[task.train.anchor]))
    assert {(int(tf.rows[a]), int(tf.rows[p])) for a, p in small.relevant} == task.relevant


def test_training_and_metrics_equal_the_whole_store():
    task, store_x = spread_task()
    cfg = TrainConfig(epochs=3, batch_size=16, mined_k=4, remine=True, patience=5)
    head = HeadConfig(depth=1, hidden=16, in_dim=store_x.shape[1])
    whole = torch.from_numpy(store_x)
    torch.manual_seed(0)
    m1, n1, r1 = train_stack(task, whole, head, [cfg, cfg.replace(seed=1)], progress=False)
    tf = TaskFeatures.for_task(RecordingStore(store_x), task)
    small, X = tf.remap(task), tf.read()
    m2, n2, r2 = train_stack(small, X, head, [cfg, cfg.replace(seed=1)], progress=False)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)
    assert [r.history for r in r1] == [r.history for r in r2]
    e1 = evaluate_head(task, whole, m1, n1, cfg.eval_energy, ("dev", "test"))
    e2 = evaluate_head(small, X, m2, n2, cfg.eval_energy, ("dev", "test"))
    assert e1 == e2


def test_every_row_when_asked():
    task, store_x = spread_task(extra=50)
    store = RecordingStore(store_x)
    tf = TaskFeatures.for_task(store, task, None)  # an anchor over the whole store
    assert tf.remap(task) is task and len(tf.read()) == len(store_x) and store.reads == [None]
