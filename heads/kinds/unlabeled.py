"""Unlabeled texts joined to a task (`--unlabeled`): the large corpus a few positive pairs are searched against.

A positives-only pairs table scored alone is an easy task unlike the user's: each anchor ranks only the ~100
positives of its split, and impostors come from the pairs' own positives. With unlabeled texts it becomes, for
ranking, what a BEIR folder is (heads.kinds.ir): the anchors are the queries and the corpus is every positive
of the table plus the unlabeled texts, one corpus that dev and test share. The unlabeled texts are then
- the distractors every dev and test anchor ranks its positives against,
- the pool mined impostors come from (with the positives; known positives are never mined),
- the anchor regulariser's sample (heads.training.anchor; unless --anchor-data names another set).
A BEIR task takes them the same way (its corpus grows by them); other kinds only as the anchor's sample.

Overlaps are said and counted, never silent: an unlabeled text that is also a positive (a corpus document) is
that one document, relevant to its own anchor and a distractor to the others, not counted twice; an unlabeled
text that is also an anchor (a query) is left out of the distractors, the impostor pool and the anchor's sample,
so it is never a distractor for its own anchor. Where they only train (kinds other than IR: the anchor's sample,
a classifier's pseudo-labels), an unlabeled text that a dev or test item scores is left out and counted. Every
unlabeled text must be in the store in the document role (`cli featurize --unlabeled`): the error names how many
are missing and the line of the first.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np

from headstore.data.text_id import doc_text, text_ids
from headstore.data.unlabeled import UnlabeledTexts, read_unlabeled
from headstore.heads.kinds.base import Task, store_rows
from headstore.heads.kinds.ir import KIND as IR_KIND
from headstore.heads.kinds.ranking import IRSplit
from headstore.heads.kinds.registry import held_out_rows
from headstore.heads.scoring.losses import LOSSES


@dataclass(frozen=True)
class Unlabeled:
    """The unlabeled texts of a task: their store rows (document role; the texts that are also anchors left
    out), the anchor regulariser's sample, and what metrics.json says of them."""

    rows: np.ndarray  # (U,) int64 store rows (a ROW_FIELDS name: remapped with the task)
    report: dict  # files, counts, overlaps, the corpus they joined


def _task_texts(ds) -> tuple[list[str], list[str]]:
    """(anchor texts, positive texts) of a dataset: the queries and the documents of a BEIR folder, the two
    text columns of a table (pairs, STS), the texts of labelled texts (anchors, no positives)."""
    if ds.kind == "beir":
        corpus = ds.beir.corpus
        return ds.beir.queries["text"].to_list(), [doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])]
    frame = ds.frame
    columns = {"pairs": ("anchor", "positive"), "sts": ("sentence1", "sentence2")}.get(ds.kind, ("text", None))
    return frame[columns[0]].to_list(), (frame[columns[1]].to_list() if columns[1] else [])


def unlabeled_in_store(store, paths) -> tuple[UnlabeledTexts, np.ndarray]:
    """The unlabeled texts of `paths` and their store rows (document role): one error at the first text missing
    from `store` (a FeatureStore), saying how many are missing and how to featurize them."""
    found = read_unlabeled(paths)
    return found, _rows_in_store(store, found, paths)


def _rows_in_store(store, found: UnlabeledTexts, paths) -> np.ndarray:
    rows = store.find_rows(store.row_ids(found.texts, "document"))
    missing = np.flatnonzero(rows < 0)
    if len(missing):
        given = " ".join(f"--unlabeled {p}" for p in paths)
        raise found.error(int(missing[0]), f"{len(missing)} of the {len(found.texts)} unlabeled texts are not in the "
                          f"feature store {store.path}, the first here (featurize them: cli featurize --model MODEL "
                          f"--store {store.path} {given}, with the store's model)")
    return rows


def join_unlabeled(task: Task, ds, store, paths) -> Task:
    """`task` with the unlabeled texts of `paths` joined: for the IR kind (positives-only pairs, BEIR) the corpus
    every split ranks and mining draws from; for every kind the anchor regulariser's sample (Task.unlabeled)."""
    found, rows = unlabeled_in_store(store, paths)
    ids = text_ids(found.texts)
    anchor_texts, positive_texts = _task_texts(ds)
    anchors, positives = set(text_ids(anchor_texts)), set(text_ids(positive_texts))
    is_anchor = np.array([i in anchors for i in ids], dtype=bool)
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]  # what made them: a grid head's id
    report = {"files": list(found.paths), "texts": len(found.texts), "digest": digest, "duplicates": found.duplicates,
              "skipped_empty": found.skipped_empty, "also_anchors": int(is_anchor.sum()),
              "also_positives": sum(i in positives for i in ids)}
    kept_ids = [i for i, a in zip(ids, is_anchor) if not a]
    kept_rows = rows[~is_anchor]
    if task.kind != IR_KIND.name:  # they train only (anchor sample, pseudo-labels): never a dev or test text
        scored = np.isin(kept_rows, held_out_rows(task))
        report["also_dev_test"] = int(scored.sum())
        return dataclasses.replace(task, unlabeled=Unlabeled(kept_rows[~scored], report))
    if ds.kind == "pairs":
        doc_ids, doc_rows, n_own = _pairs_corpus(ds, store, positive_texts, kept_ids, kept_rows)
        what = f"every positive of the table ({n_own})"
    else:  # BEIR: its corpus, the unlabeled texts appended (a text already a document is that document)
        first = next(iter(task.eval_sets.values()), None)
        own_ids = list(first.doc_ids) if first is not None else []
        own_rows = first.doc_rows if first is not None else np.zeros(0, np.int64)
        new = ~np.isin(kept_rows, own_rows)
        doc_ids = own_ids + [i for i, n in zip(kept_ids, new) if n]
        doc_rows = np.concatenate([own_rows, kept_rows[new]])
        what = f"the dataset's corpus ({len(own_ids)})"
    eval_sets = {s: dataclasses.replace(d, doc_ids=doc_ids, doc_rows=doc_rows, texts=None)  # (no lexical channel
                 if isinstance(d, IRSplit) else d for s, d in task.eval_sets.items()}  # over unlabeled texts yet)
    report["corpus"] = len(doc_ids)
    evaluation = (f"retrieval (positive pairs + unlabeled texts): each anchor ranks a corpus of {len(doc_ids)} "
                  f"documents, {what} and the {len(kept_ids)} unlabeled texts that are no anchor (IR metrics, "
                  "nDCG@10)" if ds.kind == "pairs" else
                  f"{task.evaluation}; the corpus: {what} and {len(kept_ids)} unlabeled texts, {len(doc_ids)} in all")
    corpus_rows = None if task.corpus_rows is None else np.unique(doc_rows)
    return dataclasses.replace(task, eval_sets=eval_sets, corpus_rows=corpus_rows, evaluation=evaluation,
                               unlabeled=Unlabeled(kept_rows, report))


def _pairs_corpus(ds, store, positive_texts: list[str], kept_ids: list[str], kept_rows: np.ndarray):
    """(doc ids, doc rows, positives) of a pairs table's corpus: its unique positives (any split), then the
    unlabeled texts that are neither a positive nor an anchor. Ids are text ids (IRSplit.exclude_self)."""
    unique = list(dict.fromkeys(positive_texts))
    own_ids = text_ids(unique)
    own_rows = store_rows(store, unique, f"{ds.path} positives", "document")
    seen = set(own_ids)
    new = np.array([i not in seen for i in kept_ids], dtype=bool)
    doc_ids = own_ids + [i for i, n in zip(kept_ids, new) if n]
    return doc_ids, np.concatenate([own_rows, kept_rows[new]]).astype(np.int64), len(own_ids)


def unlabeled_report(task: Task, cfg=None, splits: tuple[str, ...] = ()) -> dict:
    """metrics.json "unlabeled": the counts and the roles the texts played in this run (`cfg`: a training
    run's TrainConfig; None: an evaluation), {} without unlabeled texts. A run in which they play no role is
    an error saying what would give them one."""
    u = task.unlabeled
    if u is None:
        return {}
    roles = {}
    if u.report.get("corpus") is not None:
        scored = ", ".join(s for s in splits if s in task.eval_sets) or "every"
        roles["distractors"] = (f"every {scored} anchor ranks its positives against them (a corpus of "
                                f"{u.report['corpus']} documents)")
    if cfg is not None and cfg.mined_k and LOSSES[cfg.loss].negatives and task.corpus_rows is not None \
            and u.report.get("corpus") is not None:
        roles["impostors"] = f"the pool mined impostors come from ({cfg.mined_k} per pair, never a known positive)"
    if cfg is not None and cfg.anchor_weight and not cfg.anchor_data:
        roles["anchor"] = f"the anchor regulariser's sample (--anchor-weight {cfg.anchor_weight:g})"
    if cfg is not None and cfg.self_train:  # a classifier head's self-training (heads.training.linear_fit)
        roles["pseudo_labels"] = (f"self-training: pseudo-labelled by the classifier head, {cfg.self_train} rounds "
                                  f"of up to {cfg.self_train_add} x round texts per class")
    if not roles:
        use = ("they are distractors only where anchors rank a corpus (positives-only pairs, BEIR)" if cfg is None
               else "set --anchor-weight above 0 to make them the anchor regulariser's sample, or with labelled "
                    "texts --self-train N for a classifier head to pseudo-label them")
        raise ValueError(f"--unlabeled {' '.join(u.report['files'])}: the unlabeled texts play no role in this "
                         f"{task.kind!r} task ({use}; or leave --unlabeled out)")
    return {**u.report, "roles": roles}


def grid_report(task: Task, configs) -> dict:
    """unlabeled_report over a grid's training configs: the roles any of them gives the texts (an error only
    where none gives them one)."""
    if task.unlabeled is None:
        return {}
    roles, error = {}, None
    for cfg in configs:
        try:
            roles.update(unlabeled_report(task, cfg, ("dev", "test"))["roles"])
        except ValueError as err:
            error = err
    if not roles:
        raise error
    return {**task.unlabeled.report, "roles": roles}


def unlabeled_line(report: dict) -> str:
    """The terminal's one line on the unlabeled texts (metrics.json "unlabeled")."""
    skips = [f"{report[k]} {w}" for k, w in (("also_anchors", "also anchors (left out: never a distractor for "
                                               "their own anchor)"),
                                              ("also_positives", "also positives (one document each, not twice)"),
                                              ("also_dev_test", "dev or test texts (left out: never trained on)"),
                                              ("duplicates", "duplicates"), ("skipped_empty", "empty (skipped)"))
             if report.get(k)]
    return (f"unlabeled: {report['texts']} texts ({', '.join(report['files'])}) as "
            f"{', '.join(report['roles'])}" + (f"; {', '.join(skips)}" if skips else ""))
