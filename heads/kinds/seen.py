"""Seen and unseen evaluation queries: which part of an IR figure is on documents the training judged.

A query of an evaluation split is *seen* when at least one of its relevant documents (grade > 0) is a document
the training run judged relevant; otherwise it is *unseen*. The run's judgements are its train pairs and, for every
split but dev itself, dev's relevant judgements too, which selection saw (heads.kinds.task_seen_masks): an unseen
test query's documents met no judgement of the run. Documents are compared by store row (the text's id under the
document prompt), so the rule holds across splits, datasets and `cli eval` of a head on another dataset: a
transfer dataset whose documents were never judged is "all unseen". For a pairs table scored as retrieval, an
anchor is seen when one of its positives is a positive of a training anchor.

A head trained on judged documents can learn where those documents lie rather than a function that generalises
(docs: the seen/unseen split); every IR report gives the figures on each part beside the whole.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from headstore.heads.kinds.ranking import IRSplit
from headstore.heads.scoring.bootstrap import two_level_ci

PARTS = ("seen", "unseen")  # the two parts of a split, in report order
N_BOOT = 1000  # bootstrap resamples of each part's intervals (queries resampled; paired head vs frozen)


def judged_documents(positive_rows: Iterable[int]) -> frozenset[int]:
    """The store rows of the documents judged relevant in training (a PairSet's `positive`, or a head's record)."""
    return frozenset(int(r) for r in positive_rows)


def seen_mask(split: IRSplit, judged: frozenset[int]) -> np.ndarray:
    """(Q,) bool, in `split.query_ids` order: True where one of the query's relevant documents is judged."""
    row_of = dict(zip(split.doc_ids, split.doc_rows.tolist()))
    return np.array([any(g > 0 and row_of.get(d) in judged for d, g in split.qrels.get(q, {}).items())
                     for q in split.query_ids], dtype=bool)


def scored_seen_mask(split: IRSplit, judged: frozenset[int]) -> np.ndarray:
    """The seen mask of the queries the IR metrics score (those with judgements, as trec_eval: a query with no
    qrels line has no per-query value), aligned with their per-query values."""
    scored = np.array([bool(split.qrels.get(q)) for q in split.query_ids], dtype=bool)
    return seen_mask(split, judged)[scored]


def relevant_pairs(split: IRSplit) -> tuple[np.ndarray, np.ndarray]:
    """(query rows, document rows) (P,) each: every relevant (grade > 0) judgement of a split whose document is
    in its corpus."""
    row_of = dict(zip(split.doc_ids, split.doc_rows.tolist()))
    pairs = [(qr, row_of[d]) for q, qr in zip(split.query_ids, split.query_rows.tolist())
             for d, g in split.qrels.get(q, {}).items() if g > 0 and d in row_of]
    return tuple(np.array([p[i] for p in pairs], dtype=np.int64) for i in (0, 1))


def split_counts(mask: np.ndarray) -> dict[str, int]:
    """{'seen': n, 'unseen': n, 'all': n} of a seen mask."""
    n_seen = int(mask.sum())
    return {"seen": n_seen, "unseen": int(len(mask) - n_seen), "all": int(len(mask))}


def seen_parts(baseline, head, mask, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """The figures of each part (seen, unseen) and of all queries from per-query values: any scorer's.

    baseline: (n,) or (S, n) per-query values of the reference (the frozen features); head: (S, n) or (n,) of
    the system (S seeds, each row one); mask: (n,) bool, `seen_mask`'s. Each part: {"n", "baseline", "head",
    "delta" (head - baseline: means over queries, then over seeds), "ci": {"baseline", "head", "delta"}}, the
    95% intervals by the bootstrap of heads.scoring.bootstrap (queries resampled, and seeds where S > 1; delta
    paired: the same queries for both, seed s against the baseline's row s). A part of one query has no
    interval (None); an empty part is {"n": 0}."""
    mask = np.asarray(mask, dtype=bool)
    head = np.atleast_2d(np.asarray(head, dtype=np.float64))  # (S, n)
    base = np.broadcast_to(np.atleast_2d(np.asarray(baseline, dtype=np.float64)), head.shape)  # (S, n)
    if head.shape[1] != len(mask):
        raise ValueError(f"seen_parts: {head.shape[1]} per-query values but a mask of {len(mask)} queries")
    out = {}
    for part, keep in (("seen", mask), ("unseen", ~mask), ("all", np.ones_like(mask))):
        out[part] = _part(base[:, keep], head[:, keep], n_boot, seed)
    return out


def _part(base: np.ndarray, head: np.ndarray, n_boot: int, seed: int) -> dict:
    n = base.shape[1]
    if n == 0:
        return {"n": 0}
    b, h = float(base.mean(1).mean()), float(head.mean(1).mean())
    ci = {"baseline": None, "head": None, "delta": None}
    if n >= 2:
        ci = {"baseline": list(two_level_ci(base, n_boot, seed)), "head": list(two_level_ci(head, n_boot, seed)),
              "delta": list(two_level_ci(head, n_boot, seed, minus=base))}
    return {"n": n, "baseline": b, "head": h, "delta": h - b, "ci": ci}


def parts_note(counts: dict[str, int], split: str) -> str:
    """What a reader must be told of a split's parts: all unseen, or every query seen (the split says nothing
    of new documents); "" otherwise."""
    if counts["all"] and not counts["seen"]:
        return (f"all unseen: none of the {counts['all']} {split} queries has a relevant document the training "
                "judged")
    if counts["all"] and not counts["unseen"]:
        return (f"every {split} query is seen: each of the {counts['all']} has a relevant document the training "
                "judged, so the figure says nothing of documents the head never trained on")
    return ""


def parts_block(baseline, head, mask, split: str) -> dict:
    """metrics.json "parts" of one split: `seen_parts` and, where all queries fall in one part, its `parts_note`."""
    note = parts_note(split_counts(np.asarray(mask, dtype=bool)), split)
    return {**seen_parts(baseline, head, mask), **({"note": note} if note else {})}
