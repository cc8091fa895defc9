"""The pairs kind: pair classification of labelled pairs (a `label` column with both 0 and 1): AUC primary,
best accuracy and F1 with their thresholds, average precision.

A pairs table whose pairs are all positive (no `label` column, or every label 1) is no classification
task: it is scored as retrieval (the IR kind), each anchor ranking all positives of its split (the pairs'
texts are the corpus; identical texts are one document, an anchor with several positives has several
relevant documents), and mined impostors come from the train pairs' own positives.
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score

from headstore.heads.kinds.ir import KIND as IR_KIND, retrieval_split
from headstore.heads.kinds.base import PREFIX, Task, TaskKind
from headstore.heads.kinds.tables import COLUMNS, evaluate_pairs, pair_set, split_frames, table_splits
from headstore.heads.scoring.metrics import bootstrap_ci, pair_metrics

RETRIEVAL = ("retrieval (positive pairs only): each anchor ranks all positives of its split "
             "(IR metrics, nDCG@10)")


class PairsKind(TaskKind):
    name = "pairs"
    form = "binary"
    suggestion = "--graded pearson, --depth 1 --lr 1e-3, --normalize l2"
    statistic = "auc"  # the primary metric is a rank statistic against the gold
    metric_names = tuple(f"{{p}}_{n}" for n in ("auc", "accuracy", "accuracy_threshold", "f1", "f1_threshold", "ap"))

    def primary_metric(self, energy: str) -> str:
        return f"{PREFIX[energy]}_auc"

    def evaluate(self, task, split, embed, energies):
        return evaluate_pairs(task.eval_sets[split], embed, energies, _metrics, self.nan_metrics)

    def ci(self, task, split, values, n_boot=1000):
        gold = task.eval_sets[split].labels
        return list(bootstrap_ci(values, gold=(gold > 0.5).astype(float), statistic=self.statistic, n_boot=n_boot))


def _metrics(data, e: np.ndarray, p: str) -> dict:
    labels = np.asarray(data.labels) > 0.5
    out = {f"{p}_{k}": v for k, v in pair_metrics(e, labels.astype(int)).items()}
    out[f"{p}_ap"] = float(average_precision_score(labels, -e))
    return out


KIND = PairsKind()


def from_table(ds, store, for_eval: bool, shared_corpus: bool = False) -> Task:
    """A pairs table joined to the store: labelled pairs (this kind) or positive pairs only (the IR kind).
    `shared_corpus`: positive pairs will rank a corpus beside their positives (--unlabeled, heads.kinds.unlabeled):
    a dev carved from train is carved by anchor text, as a BEIR folder's by query text (dev must look like test)."""
    retrieval = bool((ds.frame["label"] == 1.0).all())
    frame, dev_note = table_splits(ds, for_eval, by_anchor=shared_corpus and retrieval)
    train, eval_sets = None, {}
    for split, part in split_frames(frame):
        where = f"{ds.path} split {split!r}"
        labels = None if retrieval else part["label"].to_numpy().astype(np.float32)
        if split == "train" and not for_eval:
            train = pair_set(store, ds, part, where, labels)
        elif retrieval:
            a_col, b_col = COLUMNS[ds.kind]
            eval_sets[split] = retrieval_split(store, part[a_col].to_list(), part[b_col].to_list(), where,
                                               ds.role_of(a_col))
        else:
            eval_sets[split] = pair_set(store, ds, part, where, labels)
            _check_both_classes(labels, where)
    relevant, corpus_rows = set(), None
    if train is not None:
        keep = np.ones(len(train), bool) if train.labels is None else train.labels > 0.5
        relevant = set(zip(train.anchor[keep].tolist(), train.positive[keep].tolist()))
        if retrieval:  # mined impostors come from the train pairs' own positives
            corpus_rows = np.unique(train.positive)
    if retrieval:
        return Task(ds.name, IR_KIND.name, train, eval_sets, dev_note, corpus_rows, relevant, RETRIEVAL)
    evaluation = "pair classification (labelled pairs): AUC, best F1 and accuracy, AP"
    return Task(ds.name, KIND.name, train, eval_sets, dev_note, corpus_rows, relevant, evaluation)


def _check_both_classes(labels: np.ndarray, where: str) -> None:
    positive = labels > 0.5
    if positive.all() or not positive.any():
        only = "positive (1)" if positive.all() else "negative (0)"
        raise ValueError(f"{where}: every pair is labelled {only}; AUC/F1 need both classes (add pairs of the "
                         "other class, or drop the label column to evaluate positive pairs as retrieval)")
