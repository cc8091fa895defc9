"""Seen and unseen evaluation queries: which part of an IR figure is on documents the training judged.

A query of an evaluation split is *seen* when at least one of its relevant documents (grade > 0) is a document
judged relevant for a query the head trained on; otherwise it is *unseen*. Documents are compared by store row
(the text's id under the document prompt), so the rule holds across splits, datasets and `cli eval` of a head on
another dataset: a transfer dataset whose documents were never judged is "all unseen". For a pairs table scored as
retrieval, an anchor is seen when one of its positives is a positive of a training anchor.

A head trained on judged documents can learn where those documents lie rather than a function that generalises
(docs: the seen/unseen split); every IR report gives the figures on each part beside the whole.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from headstore.heads.kinds.ranking import IRSplit

PARTS = ("seen", "unseen")  # the two parts of a split, in report order


def judged_documents(positive_rows: Iterable[int]) -> frozenset[int]:
    """The store rows of the documents judged relevant in training (a PairSet's `positive`, or a head's record)."""
    return frozenset(int(r) for r in positive_rows)


def seen_mask(split: IRSplit, judged: frozenset[int]) -> np.ndarray:
    """(Q,) bool, in `split.query_ids` order: True where one of the query's relevant documents is judged."""
    row_of = dict(zip(split.doc_ids, split.doc_rows.tolist()))
    return np.array([any(g > 0 and row_of.get(d) in judged for d, g in split.qrels.get(q, {}).items())
                     for q in split.query_ids], dtype=bool)


def split_counts(mask: np.ndarray) -> dict[str, int]:
    """{'seen': n, 'unseen': n, 'all': n} of a seen mask."""
    n_seen = int(mask.sum())
    return {"seen": n_seen, "unseen": int(len(mask) - n_seen), "all": int(len(mask))}
