"""Evaluation metrics: IR from one top-k pass (sliced per k), STS correlations, pair classification,
and bootstrap confidence intervals. Energies: lower = better everywhere.

IR definitions (trec_eval's, checked against pytrec_eval in the tests; relevance = grade > 0):
- nDCG@k (ndcg_cut_k): sum_{r <= k} grade(d_r) / log2(r + 1), divided by the same sum over the ideal
  ranking of all judged grades (grades <= 0 count as gain 0: a negative grade is non-relevant);
- MRR@k (recip_rank of the top k): 1 / rank of the first relevant doc within the top k, else 0;
- Recall@k (recall_k): |relevant in top k| / |relevant|;
- MAP@k (map_cut_k): sum over relevant docs at rank r <= k of precision@r, divided by |relevant|.
Every query that has judgements is scored, and one whose judgements are all grade <= 0 scores 0 on
every metric and counts in the mean, as trec_eval counts it. Ties in energy are broken as trec_eval
breaks ties in score: by document id, in decreasing (byte) order (`trec_tie_order`).

Confidence intervals: `scipy.stats.bootstrap`, percentile method, resampling queries or pairs; with
several inputs (gold and predictions, or one prediction per seed) the resampling is paired.
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

EnergySource = Union[torch.Tensor, Iterable[torch.Tensor], Callable[[int, int], torch.Tensor]]


def trec_tie_order(doc_ids: Sequence[str]) -> np.ndarray:
    """(N,) position of each document among equal energies: trec_eval orders tied scores by document id,
    decreasing (strcmp on the bytes; Python's str order is the same for UTF-8)."""
    order = sorted(range(len(doc_ids)), key=lambda i: doc_ids[i], reverse=True)
    tie = np.empty(len(doc_ids), dtype=np.int64)
    tie[order] = np.arange(len(doc_ids))
    return tie


def _break_ties(chunk: torch.Tensor, val: torch.Tensor, idx: torch.Tensor, tie_order: np.ndarray):
    """Re-rank rows whose top k holds equal energies (or cuts through them) by tie_order. val, idx (c, k) on
    the CPU; chunk (c, N) where it was computed (a GPU: only the tied rows' candidates come to the CPU)."""
    kk = val.shape[1]
    if kk == 0:
        return val, idx
    candidates = chunk <= val[:, -1:].to(chunk.device)  # (c, N): everything tied with or better than the k-th
    tied = (candidates.sum(1).cpu() > kk) | (val[:, 1:] == val[:, :-1]).any(1)
    if not bool(tied.any()):
        return val, idx
    val, idx = val.clone(), idx.clone()
    for r in torch.nonzero(tied).flatten().tolist():
        cand = torch.nonzero(candidates[r]).flatten().cpu().numpy()
        e = chunk[r, torch.as_tensor(cand, device=chunk.device)].cpu().numpy()
        best = np.lexsort((tie_order[cand], e))[:kk]
        idx[r] = torch.as_tensor(cand[best])
        val[r] = torch.as_tensor(e[best])
    return val, idx


def topk_ranking(energies: EnergySource, k: int = 100, *, n_queries: Optional[int] = None,
                 chunk_size: int = 1024, exclude: Optional[Sequence[Sequence[int]]] = None,
                 return_energies: bool = False, tie_order: Optional[np.ndarray] = None):
    """Exact top-k lowest-energy docs per query, chunked over queries to bound memory.

    energies: a (Q, N) tensor; an iterable of (q_chunk, N) tensors in query order; or a callable
      fn(start, stop) -> (stop - start, N) energies (then give n_queries).
    exclude: optional per-query lists of doc indices never to return (e.g. the query itself).
    tie_order: optional (N,) rank of each doc among equal energies (`trec_tie_order(doc_ids)` ranks
      as trec_eval does); without it ties come out in torch.topk's order.
    Returns indices (Q, min(k, N)) int64, best first; with return_energies also their energies."""
    if isinstance(energies, torch.Tensor):
        if energies.dim() != 2:
            raise ValueError(f"topk_ranking: energies must be (Q, N); got {tuple(energies.shape)}")
        chunks = (energies[s:s + chunk_size] for s in range(0, energies.shape[0], chunk_size))
    elif callable(energies):
        if n_queries is None:
            raise ValueError("topk_ranking: a callable energy source needs n_queries")
        chunks = (energies(s, min(s + chunk_size, n_queries)) for s in range(0, n_queries, chunk_size))
    else:
        chunks = iter(energies)
    all_idx, all_val, start = [], [], 0
    for chunk in chunks:
        chunk = chunk.detach()
        if exclude is not None:
            chunk = chunk.clone()
            for r in range(chunk.shape[0]):
                drop = list(exclude[start + r])
                if drop:
                    chunk[r, drop] = float("inf")
        kk = min(k, chunk.shape[1])
        val, idx = torch.topk(chunk, kk, dim=1, largest=False, sorted=True)
        if tie_order is not None:
            val, idx = _break_ties(chunk, val.cpu(), idx.cpu(), tie_order)
        all_idx.append(idx.cpu())
        all_val.append(val.cpu())
        start += chunk.shape[0]
    if n_queries is not None and start != n_queries:
        raise ValueError(f"topk_ranking: energy source gave {start} queries, expected {n_queries}")
    indices = torch.cat(all_idx) if all_idx else torch.zeros(0, 0, dtype=torch.long)
    return (indices, torch.cat(all_val)) if return_energies else indices


def _ranked_lists(ranked, query_ids, doc_ids) -> dict[str, list[str]]:
    if isinstance(ranked, Mapping):
        return {str(q): [str(d) for d in docs] for q, docs in ranked.items()}
    if query_ids is None:
        raise ValueError("ir_metrics_per_query: give query_ids (one per ranked row) or ranked as "
                         "{qid: [docid, ...]}")
    if isinstance(ranked, torch.Tensor):
        ranked = ranked.cpu().numpy()
    if isinstance(ranked, np.ndarray) and np.issubdtype(ranked.dtype, np.integer):
        if doc_ids is None:
            raise ValueError("ir_metrics_per_query: integer rankings need doc_ids to map indices to document ids")
        doc_ids = np.asarray(doc_ids)
        ranked = [[str(d) for d in doc_ids[row]] for row in ranked]
    if len(ranked) != len(query_ids):
        raise ValueError(f"ir_metrics_per_query: {len(ranked)} ranked rows but {len(query_ids)} query ids")
    return {str(q): [str(d) for d in row] for q, row in zip(query_ids, ranked)}


def ndcg_and_ap(gains: np.ndarray, ideal: np.ndarray, n_rel: np.ndarray, ks: Sequence[int] = (10,),
                ap_depth: Optional[int] = None) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Per ranked list: nDCG@k for each k in ks, and average precision over the first ap_depth ranks (all
    when None); the maths of the IR metrics (graded gains) and of the labelled-text retrieval view (binary).

    gains (n, m): the gain of each ranked item, best first (> 0: relevant; binary gains may be bool);
    ideal (n, g): the gains of every relevant item, ranked or not, in decreasing order (0-padded; only the
    first max(ks) count); n_rel (n,): how many items are relevant (AP's denominator: a relevant item the
    list misses counts as a miss). A list with n_rel = 0 gets NaN."""
    discounts = 1.0 / np.log2(np.arange(2, gains.shape[1] + 2))  # (m,) 1 / log2(rank + 1)
    ideal_disc = 1.0 / np.log2(np.arange(2, ideal.shape[1] + 2))  # (g,)
    hits = gains[:, :ap_depth] > 0  # (n, depth)
    precision = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)  # precision@r at every rank r
    with np.errstate(invalid="ignore", divide="ignore"):  # n_rel = 0: 0 / 0
        ndcg = {k: (gains[:, :k] * discounts[:k]).sum(1) / (ideal[:, :k] * ideal_disc[:k]).sum(1) for k in ks}
        return ndcg, (precision * hits).sum(1) / n_rel


def ir_metrics_per_query(ranked, qrels: Mapping[str, Mapping[str, int]], ks: Sequence[int] = (1, 10, 100), *,
                         query_ids: Optional[Sequence[str]] = None, doc_ids=None):
    """Per-query metric values: (scored query ids, {metric: array (n_scored,)}).

    ranked: {qid: [docid, ...]} best first; or rows aligned with query_ids, either lists of doc ids or
    an integer (Q, k) index array / tensor into doc_ids (e.g. from topk_ranking).
    Metrics: ndcg@k, mrr@k, recall@k for k in ks (plus ndcg@10 / mrr@10 always) and map@max(ks).
    Scored: every ranked query with judgements in qrels (all-non-relevant ones score 0, as in trec_eval)."""
    lists = _ranked_lists(ranked, query_ids, doc_ids)
    cut_ks = sorted(set(ks) | {10})
    map_k = max(ks)
    names = [f"{m}@{k}" for m in ("ndcg", "mrr", "recall") for k in cut_ks] + [f"map@{map_k}"]
    values = {n: [] for n in names}
    scored = []
    for qid, docs in lists.items():
        if qid not in qrels or not qrels[qid]:
            continue  # trec_eval scores only the queries that have judgements
        judged = {str(d): int(g) for d, g in qrels[qid].items()}
        n_rel = sum(g > 0 for g in judged.values())
        if len(set(docs)) != len(docs):
            raise ValueError(f"ir_metrics_per_query: query {qid} ranks a document twice")
        scored.append(qid)
        if n_rel == 0:  # judged, nothing relevant: 0 on every metric, and it counts (trec_eval)
            for n in names:
                values[n].append(0.0)
            continue
        grades = np.array([max(judged.get(d, 0), 0) for d in docs], dtype=np.float64)  # (k_run,)
        rel = grades > 0
        ideal = np.sort(np.array([g for g in judged.values() if g > 0], dtype=np.float64))[::-1]
        # one list at a time: 0-padding lists of unequal length into one matrix would change numpy's
        # (pairwise) summation order, and so the last bits of the sums
        ndcg, ap = ndcg_and_ap(grades[None], ideal[None], np.array([n_rel]), cut_ks, ap_depth=map_k)
        first = int(np.argmax(rel)) + 1 if rel.any() else None  # 1-based rank of first relevant
        for k in cut_ks:
            values[f"ndcg@{k}"].append(float(ndcg[k][0]))
            values[f"mrr@{k}"].append(1.0 / first if first is not None and first <= k else 0.0)
            values[f"recall@{k}"].append(float(rel[:k].sum()) / n_rel)
        values[f"map@{map_k}"].append(float(ap[0]))
    if not scored:
        raise ValueError("ir_metrics_per_query: no ranked query has judgements in qrels (check query ids)")
    return scored, {n: np.asarray(v) for n, v in values.items()}


def sts_metrics(scores_pred, gold) -> dict[str, float]:
    """Pearson and Spearman correlation of predicted similarities with gold scores.

    Pass a similarity (higher = more similar), e.g. -energy: correlation signs follow it."""
    pred, gold = np.asarray(scores_pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if pred.shape != gold.shape or pred.ndim != 1 or len(pred) < 2:
        raise ValueError(f"sts_metrics: need two 1-D arrays of equal length >= 2; got {pred.shape}, {gold.shape}")
    return {"pearson": float(stats.pearsonr(pred, gold)[0]), "spearman": float(stats.spearmanr(pred, gold)[0])}


def pair_metrics(energy, labels) -> dict[str, float]:
    """Pair classification from energies (lower = positive): ROC AUC, and the best accuracy and F1
    over thresholds t (predict positive iff energy <= t), with the thresholds that reach them."""
    e, y = np.asarray(energy, dtype=np.float64), np.asarray(labels)
    if e.shape != y.shape or e.ndim != 1 or not np.isin(y, (0, 1)).all():
        raise ValueError(f"pair_metrics: need 1-D energies and 0/1 labels of equal length; got {e.shape}, {y.shape}")
    if y.all() or not y.any():
        raise ValueError("pair_metrics: labels must contain both classes")
    # sklearn's ROC points on the score -energy: the first (threshold inf) predicts nothing positive, then
    # one per distinct energy t, in increasing t, predicts positive iff energy <= t
    fpr, tpr, score_t = roc_curve(y, -e, drop_intermediate=False)
    n_pos, n = int(y.sum()), len(y)
    tp, fp = np.rint(tpr * n_pos).astype(np.int64), np.rint(fpr * (n - n_pos)).astype(np.int64)  # (cuts + 1,)
    acc = (tp + (n - n_pos - fp)) / n
    f1 = 2 * tp / (2 * tp + fp + (n_pos - tp))
    best_acc, best_f1 = 1 + int(np.argmax(acc[1:])), 1 + int(np.argmax(f1[1:]))  # the lowest t of the best
    if acc[0] > acc[best_acc]:  # nothing positive beats every cut
        best_acc = 0
    # sklearn's thresholds are scores: reported as energies (-score), and sklearn's inf for "nothing
    # positive" as min(energy) - 1, the convention kept from the hand-written sweep
    thresholds = np.r_[e.min() - 1.0, -score_t[1:]]
    return {"auc": float(roc_auc_score(y, -e)), "accuracy": float(acc[best_acc]),
            "accuracy_threshold": float(thresholds[best_acc]),
            "f1": float(f1[best_f1]), "f1_threshold": float(thresholds[best_f1])}


def _pearson_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.mean(axis=axis, keepdims=True)
    y = y - y.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
        return (x * y).sum(axis) / np.sqrt((x * x).sum(axis) * (y * y).sum(axis))


STATISTICS = ("auc", "pearson", "spearman")  # of bootstrap_ci with gold=


def _tie_groups(v: np.ndarray) -> tuple[np.ndarray, int]:
    """(group of each item among equal values, numbered by increasing value (n,), number of groups)."""
    order = np.argsort(v, kind="stable")
    sorted_v = v[order]
    gid = np.cumsum(np.r_[True, sorted_v[1:] != sorted_v[:-1]]) - 1
    group = np.empty(len(v), dtype=np.int64)
    group[order] = gid
    return group, int(gid[-1]) + 1


def _resample_ranks(group: np.ndarray, n_groups: int, counts: np.ndarray) -> np.ndarray:
    """(B, n) rank of each item within each resample, ties averaged (scipy.stats.rankdata's "average"),
    from counts (B, n): how often each item was drawn. Group g of c drawn items holds ranks
    below + 1 .. below + c, below = the drawn items of lower groups: their mean is cumsum - (c - 1) / 2."""
    order = np.argsort(group, kind="stable")
    per_group = counts[:, order]  # (B, n) in increasing value: one column per group where there are no ties
    if n_groups < len(group):
        sorted_group = group[order]
        starts = np.r_[0, np.flatnonzero(sorted_group[1:] != sorted_group[:-1]) + 1]
        per_group = np.add.reduceat(per_group, starts, axis=1)  # (B, n_groups)
    average = np.cumsum(per_group, axis=1) - (per_group - 1) / 2
    return average[:, group]


def _weighted_pearson(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pearson of rows of a and b where item i counts w[:, i] times: (B, n) -> (B,)."""
    n = w.sum(1, keepdims=True)
    a = a - (w * a).sum(1, keepdims=True) / n
    b = b - (w * b).sum(1, keepdims=True) / n
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
        return (w * a * b).sum(1) / np.sqrt((w * a * a).sum(1) * (w * b * b).sum(1))


def seed_statistic(x: np.ndarray, gold, statistic: str):
    """fn(counts (B, n)) -> (S, B): the statistic of each seed's values x (S, n) on each resample of the items,
    a resample given by how often each item was drawn (a resample is a multiset of the items).

    "mean": the mean of the drawn items (no gold); "pearson", "spearman", "auc" against the drawn gold.
    Ranks follow from the counts (`_resample_ranks`), so no resample is sorted: each seed's and the gold's
    ties are found once here, and the gold's ranks once per set of resamples."""
    if statistic == "mean":
        return lambda counts: x @ counts.T / counts.sum(1)
    g = np.asarray(gold, dtype=np.float64)
    if statistic == "pearson":
        return lambda counts: np.stack([_weighted_pearson(np.broadcast_to(p, counts.shape),
                                                          np.broadcast_to(g, counts.shape), counts) for p in x])
    preds, gold_groups, positive = [_tie_groups(p) for p in x], _tie_groups(g), g > 0.5

    def spearman(counts: np.ndarray) -> np.ndarray:  # Pearson of the ranks, each item weighted by its count
        gold_ranks = _resample_ranks(*gold_groups, counts)
        return np.stack([_weighted_pearson(_resample_ranks(*p, counts), gold_ranks, counts) for p in preds])

    def auc(counts: np.ndarray) -> np.ndarray:  # Mann-Whitney: the positives' rank sum
        n_pos = (counts * positive).sum(1)
        n_neg = counts.sum(1) - n_pos
        with np.errstate(invalid="ignore", divide="ignore"):  # a one-class resample: NaN
            return np.stack([((counts * _resample_ranks(*p, counts) * positive).sum(1) - n_pos * (n_pos + 1) / 2)
                             / (n_pos * n_neg) for p in preds])

    return spearman if statistic == "spearman" else auc


def _rank_statistic(x: np.ndarray, gold: np.ndarray, statistic: str):
    """The vectorised statistic of `_bootstrap` for spearman / auc, on resamples given as item indices:
    the mean over the seeds of x (S, n) of statistic(pred_seed, gold) on each resample (`seed_statistic`)."""
    n = x.shape[1]
    of_counts = seed_statistic(x, gold, statistic)

    def stat(idx, axis=-1):
        rows = np.atleast_2d(idx)  # (B, n) item indices; the point estimate passes (n,)
        B = rows.shape[0]
        counts = np.bincount(((np.arange(B) * n)[:, None] + rows).ravel(), minlength=B * n).reshape(B, n)
        value = of_counts(counts.astype(np.float64)).mean(0)
        return value if np.ndim(idx) > 1 else value[0]

    return stat


def bootstrap_ci(values, n_boot: int = 1000, seed: int = 0, *, gold=None, statistic: str = "mean",
                 confidence: float = 0.95, minus=None) -> tuple[float, float]:
    """Percentile bootstrap interval (`scipy.stats.bootstrap`), resampling items with replacement.

    values: per-item values (e.g. one ir_metrics_per_query array) -> CI of their mean. With gold=, predictions
    and gold are resampled as pairs -> CI of statistic "spearman", "pearson" or "auc" (gold: 0/1 labels,
    values: a score, higher = positive). values may be (S, n): one row per seed, all resampled with the
    same items; the statistic is then the mean over the seeds of the per-seed statistic, the number a
    table of seed means reports (for "mean" that is the mean of the seed-averaged items).
    A (pred, gold) tuple as `values` is accepted too (statistic defaults to spearman then).
    minus: (S', n) values of a second system on the same items (e.g. a reference's seeds) -> CI of the
    paired difference statistic(values) - statistic(minus), both on the same resampled items."""
    if gold is None and isinstance(values, tuple) and len(values) == 2:
        values, gold = values
        statistic = "spearman" if statistic == "mean" else statistic
    x = np.asarray(values, dtype=np.float64)
    x = x[None] if x.ndim == 1 else x  # (S, n)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"bootstrap_ci: need (n,) or (seeds, n) values with n >= 2; got shape {np.shape(values)}")
    m = None if minus is None else np.atleast_2d(np.asarray(minus, dtype=np.float64))  # (S', n)
    if m is not None and m.shape[1:] != x.shape[1:]:
        raise ValueError(f"bootstrap_ci: minus shape {m.shape} does not match values {x.shape} (the same items)")
    if m is not None and gold is None:  # a difference of means is the mean of the per-item differences
        x, m = (x.mean(axis=0) - m.mean(axis=0))[None], None
    rng = np.random.default_rng(seed)
    common = dict(n_resamples=n_boot, confidence_level=confidence, method="percentile", vectorized=True,
                  rng=rng, batch=max(1, min(n_boot, 2_000_000 // x.size)))
    with warnings.catch_warnings():  # undefined resamples are handled below; scipy warns of them
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = _bootstrap(x, gold, statistic, common, m)
    # the percentile interval of the bootstrap distribution, leaving out the resamples where the statistic
    # is undefined (one class only, a constant side): scipy's own interval would be NaN then
    alpha = (1.0 - confidence) / 2
    dist = res.bootstrap_distribution
    if not np.isfinite(dist).any():
        return float("nan"), float("nan")
    lo, hi = np.nanquantile(dist, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _bootstrap(x: np.ndarray, gold, statistic: str, common: dict, minus: np.ndarray | None = None):
    """scipy.stats.bootstrap of the mean (no gold) or of the mean over seeds of statistic(pred_seed, gold)
    (minus that of `minus`'s seeds, on the same resampled items, where given)."""
    if gold is None:
        if statistic != "mean":
            raise ValueError(f"bootstrap_ci: statistic {statistic!r} needs gold=; without it: 'mean'")
        return stats.bootstrap((x.mean(axis=0),), np.mean, **common)
    g = np.asarray(gold, dtype=np.float64)
    if g.shape != x.shape[1:]:
        raise ValueError(f"bootstrap_ci: gold shape {g.shape} != values shape {x.shape[1:]}")
    if statistic not in STATISTICS:
        raise ValueError(f"bootstrap_ci: statistic {statistic!r}; valid with gold: {list(STATISTICS)}")
    if statistic in ("spearman", "auc"):  # resample item indices: ranks from counts (the same draws)
        stat = _rank_statistic(x, g, statistic)
        if minus is not None:
            of_x, of_minus = stat, _rank_statistic(minus, g, statistic)
            stat = lambda idx, axis=-1: of_x(idx, axis) - of_minus(idx, axis)  # noqa: E731
        return stats.bootstrap((np.arange(g.shape[0]),), stat, **common)
    if minus is not None:
        raise ValueError(f"bootstrap_ci: minus= supports 'mean', 'spearman' and 'auc', not {statistic!r}")

    def seed_mean(gold_resampled, *per_seed, axis=-1):  # every seed sees the same resampled items
        return np.mean([_pearson_along(p, gold_resampled, axis=axis) for p in per_seed], axis=0)

    return stats.bootstrap((g, *x), seed_mean, paired=True, **common)
