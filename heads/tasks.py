"""Join a dataset to the feature store: training pairs and evaluation sets, as store rows.

The encoder is never in the loop: every text a task needs must already be in the store
(`cli featurize`), and a task only ever holds integer row numbers into the store's feature matrix.

What each dataset is evaluated as (`Task.evaluation` says it in words, and metrics.json records it):
- BEIR folder: retrieval, each query of a split ranks the whole corpus (IR metrics, nDCG@10);
- STS table: Spearman / Pearson of -E against the gold scores, rescaled from the table's scale to [0, 1];
- labelled pairs (a `label` column with both 0 and 1): pair classification, AUC / F1 / AP;
- positive pairs only (no `label`, or every label 1): retrieval, each anchor of a split ranks all
  positives of that split (the pairs' texts are the corpus; identical texts are one document, an anchor
  with several positives has several relevant documents), IR metrics and nDCG@10 as for BEIR.

Splits: train on `train`, select on `dev`, report `test` once. A dataset without a dev split gets a held-out
slice of its train queries/pairs (`DEV_FRACTION`, drawn with `DEV_SEED`) carved *by text*: items that
share a text stay together, so no dev text appears in any train pair (`carve_dev`). IR queries are carved
by their own text; documents are the corpus that every split ranks (as test does). For evaluation only
(`for_eval=True`: `cli eval`, grid transfer, compare's out-of-domain sets), a table with no split other
than train (no split column) is scored whole, as split `all`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from headstore.data.dataset import Dataset, load_dataset
from headstore.data.readers import DETECT
from headstore.data.text_id import doc_text, text_id
from headstore.featurize.store import FeatureStore

DEV_FRACTION = 0.1  # a tenth of train queries/pairs: enough for a stable dev metric on SciFact (~80 queries)
DEV_SEED = 20260  # fixed so every head, seed and run sees the same dev slice
WHOLE = "all"  # the split name of a table scored whole (no split column, evaluation only)


@dataclass(frozen=True)
class PairSet:
    """Training pairs as store rows. `labels` is None for IR pairs (all relevant)."""

    anchor: np.ndarray  # (P,) int64 store rows
    positive: np.ndarray  # (P,) int64
    labels: np.ndarray | None = None  # (P,) float32: 1/0 for labelled pairs, score rescaled to [0, 1] for STS
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
    # pairs scored as retrieval: ids are text ids, and a query is not ranked against its own text
    # (an anchor that is also another pair's positive would otherwise come first at energy 0)
    exclude_self: bool = False


@dataclass(frozen=True)
class Task:
    """A dataset joined to a store. `kind` is "ir", "sts" or "pairs" (how it is evaluated)."""

    name: str
    kind: str
    train: PairSet | None
    eval_sets: dict[str, object]  # split -> IRSplit or PairSet (sts/pairs)
    dev_note: str = ""
    corpus_rows: np.ndarray | None = None  # IR: every document row (for mining negatives)
    relevant: set[tuple[int, int]] = field(default_factory=set)  # (anchor row, positive row) known relevant
    evaluation: str = ""  # how the evaluation splits are scored, in words
    score_range: tuple[float, float] | None = None  # sts: the scale the gold scores were rescaled from

    @property
    def primary_kind(self) -> str:
        return {"ir": "ndcg@10", "sts": "spearman", "pairs": "auc"}[self.kind]


def _rows(store: FeatureStore, texts: list[str], where: str) -> np.ndarray:
    try:
        return store.rows_for([text_id(t) for t in texts])
    except KeyError as e:
        raise ValueError(
            f"{where}: a text is not in the feature store ({e.args[0] if e.args else e}) "
            "(run `cli featurize` on this dataset first)") from None


# ---- dev carved by text -------------------------------------------------------------------------

def _components(items: list[list[str]]) -> list[list[int]]:
    """Groups of item indices connected by a shared text (union-find over the texts of each item)."""
    parent = list(range(len(items)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, texts in enumerate(items):
        for t in texts:
            j = owner.setdefault(t, i)
            ri, rj = find(i), find(j)
            if ri != rj:
                parent[ri] = rj
    groups: dict[int, list[int]] = {}
    for i in range(len(items)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def carve_dev(items: list[list[str]], unit: str = "pairs", seed: int = DEV_SEED) -> tuple[np.ndarray, np.ndarray, str]:
    """Hold out about DEV_FRACTION of the train items (pairs or queries) as dev, by text.

    items[i]: the texts item i uses. Items sharing a text (directly or through others) form a group, and
    whole groups are drawn (in a fixed random order) until the dev share is reached, so no dev text
    appears in a train item and nothing is dropped. When one group holds almost everything (a graph that
    will not split), dev is drawn item by item instead and the train items sharing a text with dev are
    dropped and counted. Returns (is_dev (n,) bool, dropped (n,) bool, a note for metrics.json)."""
    n = len(items)
    if n < 2:
        raise ValueError(f"only {n} train {unit}: too few to hold out a dev set (add a dev split)")
    target = max(1, int(round(DEV_FRACTION * n)))
    rng = np.random.default_rng(seed)
    groups = _components(items)
    is_dev = np.zeros(n, dtype=bool)
    taken = 0
    for g in rng.permutation(len(groups)):
        if taken + len(groups[g]) <= target:
            is_dev[groups[g]] = True
            taken += len(groups[g])
        if taken >= target:
            break
    dropped = np.zeros(n, dtype=bool)
    how = f"{len(groups)} groups of items sharing a text"
    if taken < max(1, target // 2):  # no split into groups of the right size: draw items, drop the overlap
        is_dev[:] = False
        is_dev[rng.permutation(n)[:target]] = True
        dev_texts = {t for i in np.flatnonzero(is_dev) for t in items[i]}
        dropped = ~is_dev & np.array([any(t in dev_texts for t in texts) for texts in items])
        how = f"drawn one by one; {int(dropped.sum())} train {unit} sharing a text with dev were dropped"
        if dropped.sum() + is_dev.sum() >= n:
            raise ValueError(f"the train {unit} share texts so much that no dev set can be held out without "
                             "emptying train (add a dev split)")
    note = (f"dev = {int(is_dev.sum())} of {n} train {unit} held out by text ({DEV_FRACTION:.0%}, seed {seed}; "
            f"{how}): no dev text appears in a train pair")
    return is_dev, dropped, note


# ---- BEIR ---------------------------------------------------------------------------------------

def _qrel_dict(frame: pl.DataFrame) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for q, d, s in frame.select("query_id", "corpus_id", "score").iter_rows():
        out.setdefault(q, {})[d] = int(s)
    return out


def _ir_task(ds: Dataset, store: FeatureStore, for_eval: bool) -> Task:
    beir = ds.beir
    corpus, queries, qrels = beir.corpus, beir.queries, beir.qrels
    doc_ids = corpus["_id"].to_list()
    docs = [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])]
    doc_rows = _rows(store, docs, f"{ds.path} corpus")
    doc_row = dict(zip(doc_ids, doc_rows.tolist()))
    q_text = dict(zip(queries["_id"].to_list(), queries["text"].to_list()))

    def ir_split(qr: dict[str, dict[str, int]]) -> IRSplit:
        qids = sorted(qr)
        rows = _rows(store, [q_text[q] for q in qids], f"{ds.path} queries")
        return IRSplit(qids, rows, doc_ids, doc_rows, qr)

    eval_sets: dict[str, object] = {}
    train = None
    dev_note = ""
    relevant: set[tuple[int, int]] = set()
    if "train" in qrels and not for_eval:
        tr = _qrel_dict(qrels["train"])
        if "dev" in qrels:
            eval_sets["dev"] = ir_split(_qrel_dict(qrels["dev"]))
        else:
            qids = sorted(tr)
            # carved by query text: the documents are the corpus every split ranks (216 of SciFact's 339
            # test-relevant documents are train positives), so dev, like test, may share relevant documents
            # with train queries. Carving by document too leaves a dev of never-trained documents that
            # selects epoch 1 and cost 0.10 nDCG@10 on SciFact test (measured): dev must look like test.
            items = [[q_text[q]] for q in qids]
            is_dev, dropped, dev_note = carve_dev(items, "queries")
            dev_note += "; documents are the shared corpus, as for test"
            eval_sets["dev"] = ir_split({q: tr[q] for q, dev in zip(qids, is_dev) if dev})
            tr = {q: tr[q] for q, dev, drop in zip(qids, is_dev, dropped) if not dev and not drop}
        pairs = [(q, d) for q in sorted(tr) for d, g in sorted(tr[q].items()) if g > 0]
        a = _rows(store, [q_text[q] for q, _ in pairs], f"{ds.path} train queries")
        p = np.array([doc_row[d] for _, d in pairs], dtype=np.int64)
        train = PairSet(a, p)
        relevant = set(zip(a.tolist(), p.tolist()))
    for split in ("dev", "test", "train"):
        if split in qrels and split not in eval_sets and (for_eval or split != "train"):
            eval_sets[split] = ir_split(_qrel_dict(qrels[split]))
    if train is None and not for_eval:
        raise ValueError(f"{ds.path}: no qrels/train.tsv to train on (splits found: "
                         f"{', '.join(sorted(qrels)) or 'none'}); train on another dataset and `cli eval` this one")
    evaluation = "retrieval: each query ranks the whole corpus (IR metrics, nDCG@10)"
    return Task(ds.name, "ir", train, eval_sets, dev_note, doc_rows, relevant, evaluation)


# ---- STS and pairs tables -----------------------------------------------------------------------

def _positives_only(ds: Dataset, frame: pl.DataFrame) -> bool:
    return ds.kind == "pairs" and bool((frame["label"] == 1.0).all())


def _carve_table_dev(frame: pl.DataFrame, text_columns: list[str]) -> tuple[pl.DataFrame, str]:
    """The frame with a dev split carved by text from its train rows (see carve_dev)."""
    is_train = (frame["split"] == "train").to_numpy()
    train_idx = np.flatnonzero(is_train)
    cols = [c for c in text_columns if c in frame.columns]
    values = [frame[c].to_list() for c in cols]
    items = [[v[i] for v in values if v[i] is not None] for i in train_idx]
    is_dev, dropped, note = carve_dev(items, "pairs")
    split = frame["split"].to_numpy().astype(object)
    split[train_idx[is_dev]] = "dev"
    split[train_idx[dropped]] = None
    frame = frame.with_columns(pl.Series("split", split.tolist(), dtype=pl.String))
    return frame.filter(pl.col("split").is_not_null()), note


def _retrieval_split(store: FeatureStore, anchors: list[str], positives: list[str], where: str) -> IRSplit:
    """Pairs as retrieval: each unique anchor ranks every unique positive; its own positives are relevant."""
    qrels: dict[str, dict[str, int]] = {}
    query_text: dict[str, str] = {}
    doc_text_of: dict[str, str] = {}
    for a, p in zip(anchors, positives):
        qa, dp = text_id(a), text_id(p)
        query_text.setdefault(qa, a)
        doc_text_of.setdefault(dp, p)
        qrels.setdefault(qa, {})[dp] = 1
    qids, dids = list(query_text), list(doc_text_of)
    return IRSplit(qids, _rows(store, [query_text[q] for q in qids], where), dids,
                   _rows(store, [doc_text_of[d] for d in dids], where), qrels, exclude_self=True)


def _table_task(ds: Dataset, store: FeatureStore, for_eval: bool) -> Task:
    frame = ds.frame
    a_col, b_col = ("sentence1", "sentence2") if ds.kind == "sts" else ("anchor", "positive")
    retrieval = _positives_only(ds, frame)
    splits = set(frame["split"].unique().to_list())
    dev_note = ""
    if for_eval and splits == {"train"}:  # no split column (or train only): score the whole table
        frame = frame.with_columns(pl.lit(WHOLE).alias("split"))
        dev_note = f"the table has no dev/test split: all {frame.height} rows are scored as split {WHOLE!r}"
    elif not for_eval and "train" not in splits:
        raise ValueError(f"{ds.path}: no train split to train on (splits found: {', '.join(sorted(splits))})")
    elif not for_eval and "dev" not in splits:
        frame, dev_note = _carve_table_dev(frame, [a_col, b_col, "negative"])
    lo, hi = ds.score_range or (0.0, 1.0)

    def pair_set(f: pl.DataFrame, where: str) -> PairSet:
        a = _rows(store, f[a_col].to_list(), where)
        b = _rows(store, f[b_col].to_list(), where)
        labels = None
        if ds.kind == "sts":
            labels = ((f["score"].to_numpy() - lo) / (hi - lo)).astype(np.float32)  # heads see [0, 1]
        elif not retrieval:
            labels = f["label"].to_numpy().astype(np.float32)
        neg = None
        if "negative" in f.columns and f["negative"].null_count() == 0:
            neg = _rows(store, f["negative"].to_list(), where)[:, None]
        return PairSet(a, b, labels, neg)

    eval_sets: dict[str, object] = {}
    train = None
    for split in sorted(set(frame["split"].unique().to_list())):
        part = frame.filter(pl.col("split") == split)
        where = f"{ds.path} split {split!r}"
        if split == "train" and not for_eval:
            train = pair_set(part, where)
        elif retrieval:
            eval_sets[split] = _retrieval_split(store, part[a_col].to_list(), part[b_col].to_list(), where)
        else:
            eval_sets[split] = pair_set(part, where)
            if ds.kind == "pairs":
                _check_both_classes(eval_sets[split].labels, where)
    relevant: set[tuple[int, int]] = set()
    corpus_rows = None
    if train is not None and ds.kind == "pairs":
        keep = np.ones(len(train), bool) if train.labels is None else train.labels > 0.5
        relevant = set(zip(train.anchor[keep].tolist(), train.positive[keep].tolist()))
        if retrieval:  # mined impostors come from the train pairs' own positives
            corpus_rows = np.unique(train.positive)
    if retrieval:
        kind, evaluation = "ir", ("retrieval (positive pairs only): each anchor ranks all positives of its split "
                                  "(IR metrics, nDCG@10)")
    elif ds.kind == "sts":
        kind, evaluation = "sts", (f"graded pairs: Spearman of -E against the gold scores "
                                   f"(scale {lo:g}-{hi:g}, rescaled to 0-1)")
    else:
        kind, evaluation = "pairs", "pair classification (labelled pairs): AUC, best F1 and accuracy, AP"
    return Task(ds.name, kind, train, eval_sets, dev_note, corpus_rows, relevant, evaluation,
                ds.score_range if ds.kind == "sts" else None)


def _check_both_classes(labels: np.ndarray, where: str) -> None:
    positive = labels > 0.5
    if positive.all() or not positive.any():
        only = "positive (1)" if positive.all() else "negative (0)"
        raise ValueError(f"{where}: every pair is labelled {only}; AUC/F1 need both classes (add pairs of the "
                         "other class, or drop the label column to evaluate positive pairs as retrieval)")


def load_task(data_path: str, store: FeatureStore, format: str | None = None, score_range=None,
              for_eval: bool = False) -> Task:
    """Read `data_path` and join it to `store` by text_id.

    score_range: the (LO, HI) scale of an STS table's scores; None detects 0-1 or 0-5.
    for_eval: only evaluation splits are wanted (no training, no dev carving; a table without a
    dev/test split is scored whole)."""
    ds = load_dataset(data_path, format, score_range=score_range if score_range is not None else DETECT)
    if ds.kind == "beir":
        return _ir_task(ds, store, for_eval)
    if ds.kind in ("sts", "pairs"):
        return _table_task(ds, store, for_eval)
    if ds.kind == "labels":  # labelled texts: heads.label_tasks
        from headstore.heads.label_tasks import label_task

        return label_task(ds, store)
    raise ValueError(f"{data_path}: a {ds.kind!r} dataset has no pairs to train or evaluate on "
                     "(use a BEIR folder, an STS table, a pairs table or labelled texts)")


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
            eval_sets[split] = dataclasses.replace(s, query_ids=ids, query_rows=s.query_rows[keep],
                                                   qrels={q: s.qrels[q] for q in ids})
        else:
            keep = ~(np.isin(s.anchor, list(rows)) | np.isin(s.positive, list(rows)))
            eval_sets[split] = PairSet(s.anchor[keep], s.positive[keep],
                                       None if s.labels is None else s.labels[keep],
                                       None if s.negative is None else s.negative[keep])
        dropped[split] = int((~keep).sum())
    note = ", ".join(f"{split}: {n} dropped" for split, n in dropped.items())
    return dataclasses.replace(task, eval_sets=eval_sets, dev_note=(task.dev_note + "; " if task.dev_note else "")
                               + f"overlap with the training dataset removed ({note})"), dropped
