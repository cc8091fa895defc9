"""Join a dataset to the feature store: training pairs and evaluation sets, as store rows.

The encoder is never in the loop: every text a task needs must already be in the store
(`cli featurize`), and a task only ever holds integer row numbers into the store's feature matrix.

Splits: train on `train`, select on `dev`, report `test` once. A dataset without a dev split gets a
held-out slice of its *train* queries/pairs (`DEV_FRACTION`, drawn with `DEV_SEED`), which is then
removed from training — so dev never overlaps what the head was trained on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from headstore.data.dataset import Dataset, load_dataset
from headstore.data.text_id import doc_text, text_id
from headstore.featurize.store import FeatureStore

DEV_FRACTION = 0.1  # a tenth of train queries/pairs: enough for a stable dev metric on SciFact (~80 queries)
DEV_SEED = 20260  # fixed so every head, seed and run sees the same dev slice


@dataclass(frozen=True)
class PairSet:
    """Training pairs as store rows. `labels` is None for IR pairs (all relevant)."""

    anchor: np.ndarray  # (P,) int64 store rows
    positive: np.ndarray  # (P,) int64
    labels: np.ndarray | None = None  # (P,) float32: 1/0 for labelled pairs, score/5 for STS
    negative: np.ndarray | None = None  # (P, K) int64 given negatives

    def __len__(self) -> int:
        return len(self.anchor)


@dataclass(frozen=True)
class IRSplit:
    """One IR evaluation split: queries ranked against the whole corpus."""

    query_ids: list[str]
    query_rows: np.ndarray  # (Q,) int64
    doc_ids: list[str]
    doc_rows: np.ndarray  # (N,) int64
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> grade


@dataclass(frozen=True)
class Task:
    """A dataset joined to a store. `kind` is "ir", "sts" or "pairs"."""

    name: str
    kind: str
    train: PairSet | None
    eval_sets: dict[str, object]  # split -> IRSplit or PairSet (sts/pairs)
    dev_note: str = ""
    corpus_rows: np.ndarray | None = None  # IR: every document row (for mining negatives)
    relevant: set[tuple[int, int]] = field(default_factory=set)  # (anchor row, positive row) known relevant

    @property
    def primary_kind(self) -> str:
        return {"ir": "ndcg@10", "sts": "spearman", "pairs": "ap"}[self.kind]


def _rows(store: FeatureStore, texts: list[str], where: str) -> np.ndarray:
    try:
        return store.rows_for([text_id(t) for t in texts])
    except KeyError as e:
        raise ValueError(
            f"{where}: a text is not in the feature store ({e}); run `cli featurize` on this dataset first"
        ) from None


def _split_dev(keys: list, seed: int = DEV_SEED) -> set:
    """A reproducible DEV_FRACTION of the unique keys (query ids or pair indices)."""
    uniq = sorted(set(keys))
    rng = np.random.default_rng(seed)
    n_dev = max(1, int(round(DEV_FRACTION * len(uniq))))
    pick = rng.permutation(len(uniq))[:n_dev]
    return {uniq[i] for i in pick}


def _ir_task(ds: Dataset, store: FeatureStore) -> Task:
    beir = ds.beir
    corpus, queries, qrels = beir.corpus, beir.queries, beir.qrels
    doc_ids = corpus["_id"].to_list()
    doc_rows = _rows(store, [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])], f"{ds.path} corpus")
    doc_row = dict(zip(doc_ids, doc_rows.tolist()))
    q_text = dict(zip(queries["_id"].to_list(), queries["text"].to_list()))

    def qrel_dict(frame: pl.DataFrame) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for q, d, s in frame.select("query_id", "corpus_id", "score").iter_rows():
            out.setdefault(q, {})[d] = int(s)
        return out

    def ir_split(qr: dict[str, dict[str, int]]) -> IRSplit:
        qids = sorted(qr)
        rows = _rows(store, [q_text[q] for q in qids], f"{ds.path} queries")
        return IRSplit(qids, rows, doc_ids, doc_rows, qr)

    eval_sets: dict[str, object] = {}
    train = None
    dev_note = ""
    relevant: set[tuple[int, int]] = set()
    if "train" in qrels:
        tr = qrel_dict(qrels["train"])
        if "dev" in qrels:
            eval_sets["dev"] = ir_split(qrel_dict(qrels["dev"]))
        else:
            dev_q = _split_dev(list(tr))
            eval_sets["dev"] = ir_split({q: tr[q] for q in dev_q})
            tr = {q: v for q, v in tr.items() if q not in dev_q}
            dev_note = f"dev = {len(dev_q)} train queries held out ({DEV_FRACTION:.0%}, seed {DEV_SEED})"
        pairs = [(q, d) for q in sorted(tr) for d, g in sorted(tr[q].items()) if g > 0]
        a = _rows(store, [q_text[q] for q, _ in pairs], f"{ds.path} train queries")
        p = np.array([doc_row[d] for _, d in pairs], dtype=np.int64)
        train = PairSet(a, p)
        relevant = set(zip(a.tolist(), p.tolist()))
    for split in ("test",) + tuple(s for s in qrels if s not in ("train", "dev", "test")):
        if split in qrels:
            eval_sets[split] = ir_split(qrel_dict(qrels[split]))
    return Task(ds.name, "ir", train, eval_sets, dev_note, doc_rows, relevant)


def _pair_task(ds: Dataset, store: FeatureStore, kind: str) -> Task:
    frame = next(iter(ds.frames.values()))
    a_col, b_col = ("sentence1", "sentence2") if kind == "sts" else ("anchor", "positive")
    if "split" not in frame.columns:
        frame = frame.with_columns(pl.lit("train").alias("split"))

    def pair_set(f: pl.DataFrame, where: str) -> PairSet:
        a = _rows(store, f[a_col].to_list(), where)
        b = _rows(store, f[b_col].to_list(), where)
        labels = None
        if kind == "sts":
            labels = (f["score"].to_numpy().astype(np.float32) / 5.0)  # STS gold is 0-5; heads see [0, 1]
        elif "label" in f.columns:
            labels = f["label"].to_numpy().astype(np.float32)
        neg = None
        if "negative" in f.columns and f["negative"].null_count() == 0:
            neg = _rows(store, f["negative"].to_list(), where)[:, None]
        return PairSet(a, b, labels, neg)

    splits = set(frame["split"].unique().to_list())
    dev_note = ""
    if "dev" not in splits and "train" in splits:
        n_train = frame.filter(pl.col("split") == "train").height
        dev_idx = _split_dev(list(range(n_train)))
        train_pos = np.cumsum(frame["split"].to_numpy() == "train") - 1
        is_dev = (frame["split"].to_numpy() == "train") & np.isin(train_pos, list(dev_idx))
        frame = frame.with_columns(pl.Series("split", np.where(is_dev, "dev", frame["split"].to_numpy())))
        dev_note = f"dev = {len(dev_idx)} train pairs held out ({DEV_FRACTION:.0%}, seed {DEV_SEED})"
    eval_sets: dict[str, object] = {}
    train = None
    for split in sorted(set(frame["split"].unique().to_list())):
        ps = pair_set(frame.filter(pl.col("split") == split), f"{ds.path} split {split!r}")
        if split == "train":
            train = ps
        else:
            eval_sets[split] = ps
    relevant = set()
    if train is not None:
        pos = train.labels is None or kind == "pairs"
        if pos:
            keep = np.ones(len(train), bool) if train.labels is None else train.labels > 0.5
            relevant = set(zip(train.anchor[keep].tolist(), train.positive[keep].tolist()))
    return Task(ds.name, kind, train, eval_sets, dev_note, None, relevant)


def load_task(data_path: str, store: FeatureStore, format: str | None = None) -> Task:
    """Read `data_path` and join it to `store` by text_id."""
    ds = load_dataset(data_path, format)
    if ds.kind == "beir":
        return _ir_task(ds, store)
    if ds.kind in ("sts", "pairs"):
        return _pair_task(ds, store, ds.kind)
    if ds.kind == "labels":  # labelled texts: heads.label_tasks
        from headstore.heads.label_tasks import label_task

        return label_task(ds, store)
    raise ValueError(f"{data_path}: a {ds.kind!r} dataset has no pairs to train or evaluate on; use beir, sts, pairs or labels")


def task_rows(task: Task) -> set[int]:
    """Every store row (text) a task uses: training pairs and all evaluation sets."""
    rows: set[int] = set()
    sets = list(task.eval_sets.values()) + ([task.train] if task.train is not None else [])
    for s in sets:
        if isinstance(s, IRSplit):
            rows.update(s.query_rows.tolist())
            rows.update(s.doc_rows.tolist())
        elif hasattr(s, "classes"):  # labelled texts (heads.label_tasks.LabelSplit)
            rows.update(s.rows.tolist())
        else:
            rows.update(s.anchor.tolist())
            rows.update(s.positive.tolist())
    return rows


def without_overlap(task: Task, rows: set[int]) -> tuple[Task, dict[str, int]]:
    """The task with every evaluation pair (STS/pairs) or query (IR) that uses one of `rows` dropped.

    For out-of-domain evaluation: e.g. SemEval STS pairs whose sentences also appear in STS-B.
    Returns the filtered task and how many items were dropped per split (reported, never silent)."""
    eval_sets: dict[str, object] = {}
    dropped: dict[str, int] = {}
    for split, s in task.eval_sets.items():
        if isinstance(s, IRSplit):
            keep = ~np.isin(s.query_rows, list(rows))
            ids = [q for q, k in zip(s.query_ids, keep) if k]
            eval_sets[split] = IRSplit(ids, s.query_rows[keep], s.doc_ids, s.doc_rows, {q: s.qrels[q] for q in ids})
        else:
            keep = ~(np.isin(s.anchor, list(rows)) | np.isin(s.positive, list(rows)))
            eval_sets[split] = PairSet(s.anchor[keep], s.positive[keep],
                                       None if s.labels is None else s.labels[keep],
                                       None if s.negative is None else s.negative[keep])
        dropped[split] = int((~keep).sum())
    note = ", ".join(f"{split}: {n} dropped" for split, n in dropped.items())
    return Task(task.name, task.kind, task.train, eval_sets, (task.dev_note + "; " if task.dev_note else "")
                + f"overlap with the training dataset removed ({note})", task.corpus_rows, task.relevant), dropped
