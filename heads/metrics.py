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
from typing import Callable, Iterable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

EnergySource = Union[torch.Tensor, Iterable[torch.Tensor], Callable[[int, int], torch.Tensor]]


def trec_tie_order(doc_ids: Sequence[str]) -> np.ndarray:
    """(N,) position of each document among equal energies: trec_eval orders tied scores by document id,
    decreasing (strcmp on the bytes; Python's str order is the same for UTF-8)."""
    order = sorted(range(len(doc_ids)), key=lambda i: doc_ids[i], reverse=True)
    tie = np.empty(len(doc_ids), dtype=np.int64)
    tie[order] = np.arange(len(doc_ids))
    return tie


def _break_ties(chunk: torch.Tensor, val: torch.Tensor, idx: torch.Tensor, tie_order: np.ndarray):
    """Re-rank rows whose top k holds equal energies (or cuts through them) by tie_order."""
    kk = val.shape[1]
    if kk == 0:
        return val, idx
    candidates = chunk <= val[:, -1:]  # (c, N): everything tied with or better than the k-th
    tied = (candidates.sum(1) > kk) | (val[:, 1:] == val[:, :-1]).any(1)
    if not bool(tied.any()):
        return val, idx
    val, idx = val.clone(), idx.clone()
    for r in torch.nonzero(tied).flatten().tolist():
        cand = torch.nonzero(candidates[r]).flatten().numpy()
        e = chunk[r, cand].numpy()
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
            val, idx = _break_ties(chunk.cpu(), val.cpu(), idx.cpu(), tie_order)
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
        raise ValueError("ir_metrics: give query_ids (one per ranked row) or ranked as {qid: [docid, ...]}")
    if isinstance(ranked, torch.Tensor):
        ranked = ranked.cpu().numpy()
    if isinstance(ranked, np.ndarray) and np.issubdtype(ranked.dtype, np.integer):
        if doc_ids is None:
            raise ValueError("ir_metrics: integer rankings need doc_ids to map indices to document ids")
        doc_ids = np.asarray(doc_ids)
        ranked = [[str(d) for d in doc_ids[row]] for row in ranked]
    if len(ranked) != len(query_ids):
        raise ValueError(f"ir_metrics: {len(ranked)} ranked rows but {len(query_ids)} query ids")
    return {str(q): [str(d) for d in row] for q, row in zip(query_ids, ranked)}


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
            raise ValueError(f"ir_metrics: query {qid} ranks a document twice")
        scored.append(qid)
        if n_rel == 0:  # judged, nothing relevant: 0 on every metric, and it counts (trec_eval)
            for n in names:
                values[n].append(0.0)
            continue
        grades = np.array([max(judged.get(d, 0), 0) for d in docs], dtype=np.float64)  # (k_run,)
        rel = grades > 0
        discounts = 1.0 / np.log2(np.arange(2, len(docs) + 2))
        ideal = np.sort(np.array([g for g in judged.values() if g > 0], dtype=np.float64))[::-1]
        ideal_disc = 1.0 / np.log2(np.arange(2, len(ideal) + 2))
        first = int(np.argmax(rel)) + 1 if rel.any() else None  # 1-based rank of first relevant
        for k in cut_ks:
            dcg = float((grades[:k] * discounts[:k]).sum())
            idcg = float((ideal[:k] * ideal_disc[:k]).sum())
            values[f"ndcg@{k}"].append(dcg / idcg)
            values[f"mrr@{k}"].append(1.0 / first if first is not None and first <= k else 0.0)
            values[f"recall@{k}"].append(float(rel[:k].sum()) / n_rel)
        hits = rel[:map_k]
        precision_at = np.cumsum(hits) / np.arange(1, len(hits) + 1)
        values[f"map@{map_k}"].append(float((precision_at * hits).sum()) / n_rel)
    if not scored:
        raise ValueError("ir_metrics: no ranked query has judgements in qrels (check query ids)")
    return scored, {n: np.asarray(v) for n, v in values.items()}


class IRResult(NamedTuple):
    metrics: dict[str, float]  # mean over scored queries
    per_query: np.ndarray  # the primary metric per scored query (for bootstrap CIs)


def ir_metrics(ranked, qrels: Mapping[str, Mapping[str, int]], ks: Sequence[int] = (1, 10, 100), *,
               query_ids: Optional[Sequence[str]] = None, doc_ids=None, primary: str = "ndcg@10") -> IRResult:
    """Aggregated IR metrics and the per-query values of `primary`; see ir_metrics_per_query."""
    _, per_query = ir_metrics_per_query(ranked, qrels, ks, query_ids=query_ids, doc_ids=doc_ids)
    if primary not in per_query:
        raise ValueError(f"primary metric {primary!r} not computed; valid: {sorted(per_query)}")
    return IRResult({n: float(v.mean()) for n, v in per_query.items()}, per_query[primary])


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
    y = y.astype(bool)
    if y.all() or not y.any():
        raise ValueError("pair_metrics: labels must contain both classes")
    order = np.argsort(e, kind="stable")
    e_sorted, y_sorted = e[order], y[order]
    last_of_value = np.r_[e_sorted[1:] != e_sorted[:-1], True]  # cut only between distinct energies
    tp = np.cumsum(y_sorted)[last_of_value]  # predicted positive = all with energy <= t
    fp = np.cumsum(~y_sorted)[last_of_value]
    thresholds = e_sorted[last_of_value]
    n_pos, n = int(y.sum()), len(y)
    tn = (n - n_pos) - fp
    acc = (tp + tn) / n
    f1 = 2 * tp / (2 * tp + fp + (n_pos - tp))
    acc_all_negative = (n - n_pos) / n  # threshold below every energy
    best_acc = int(np.argmax(acc))
    best_f1 = int(np.argmax(f1))
    accuracy, acc_t = (acc[best_acc], thresholds[best_acc]) if acc[best_acc] >= acc_all_negative \
        else (acc_all_negative, e_sorted[0] - 1.0)
    return {"auc": float(roc_auc_score(y, -e)), "accuracy": float(accuracy), "accuracy_threshold": float(acc_t),
            "f1": float(f1[best_f1]), "f1_threshold": float(thresholds[best_f1])}


def _pearson_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x = x - x.mean(axis=axis, keepdims=True)
    y = y - y.mean(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
        return (x * y).sum(axis) / np.sqrt((x * x).sum(axis) * (y * y).sum(axis))


def _spearman_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return _pearson_along(stats.rankdata(x, axis=axis), stats.rankdata(y, axis=axis), axis)


def _auc_along(score: np.ndarray, labels: np.ndarray, axis: int = -1) -> np.ndarray:
    """ROC AUC of `score` (higher = positive) against 0/1 labels, ties counted half (Mann-Whitney)."""
    positive = labels > 0.5
    n_pos = positive.sum(axis)
    n_neg = positive.shape[axis] - n_pos
    ranks = stats.rankdata(score, axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):  # a one-class resample: NaN
        return ((ranks * positive).sum(axis) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


STATISTICS = {"pearson": _pearson_along, "spearman": _spearman_along, "auc": _auc_along}


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
    B = counts.shape[0]
    flat = ((np.arange(B) * n_groups)[:, None] + group).ravel()
    per_group = np.bincount(flat, weights=counts.ravel(), minlength=B * n_groups).reshape(B, n_groups)
    average = np.cumsum(per_group, axis=1) - (per_group - 1) / 2
    return np.take_along_axis(average, np.broadcast_to(group, counts.shape), axis=1)


def _weighted_pearson(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pearson of rows of a and b where item i counts w[:, i] times: (B, n) -> (B,)."""
    n = w.sum(1, keepdims=True)
    a = a - (w * a).sum(1, keepdims=True) / n
    b = b - (w * b).sum(1, keepdims=True) / n
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
        return (w * a * b).sum(1) / np.sqrt((w * a * a).sum(1) * (w * b * b).sum(1))


def _rank_statistic(x: np.ndarray, gold: np.ndarray, statistic: str):
    """The vectorised statistic of `_bootstrap` for spearman / auc, on resamples given as item indices.

    A resample of items is a multiset of the originals, so its ranks follow from how often each item was
    drawn (`_resample_ranks`) without sorting every resample; the values equal the rank statistics of
    the resampled arrays (mean over the seeds of x (S, n) of statistic(pred_seed, gold))."""
    n = x.shape[1]
    preds = [_tie_groups(p) for p in x]
    gold_groups = _tie_groups(gold)
    positive = gold > 0.5

    def per_seed(ranks: np.ndarray, counts: np.ndarray, gold_ranks) -> np.ndarray:
        if statistic == "spearman":
            return _weighted_pearson(ranks, gold_ranks, counts)
        n_pos = (counts * positive).sum(1)
        n_neg = counts.sum(1) - n_pos
        with np.errstate(invalid="ignore", divide="ignore"):  # a one-class resample: NaN
            return ((counts * ranks * positive).sum(1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)

    def stat(idx, axis=-1):
        rows = np.atleast_2d(idx)  # (B, n) item indices; the point estimate passes (n,)
        B = rows.shape[0]
        counts = np.bincount(((np.arange(B) * n)[:, None] + rows).ravel(), minlength=B * n).reshape(B, n)
        counts = counts.astype(np.float64)
        gold_ranks = _resample_ranks(*gold_groups, counts) if statistic == "spearman" else None
        value = np.mean([per_seed(_resample_ranks(g, k, counts), counts, gold_ranks) for g, k in preds], axis=0)
        return value if np.ndim(idx) > 1 else value[0]

    return stat


def bootstrap_ci(values, n_boot: int = 1000, seed: int = 0, *, gold=None, statistic: str = "mean",
                 confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval (`scipy.stats.bootstrap`), resampling items with replacement.

    values: per-item values (e.g. IRResult.per_query) -> CI of their mean. With gold=, predictions
    and gold are resampled as pairs -> CI of statistic "spearman", "pearson" or "auc" (gold: 0/1 labels,
    values: a score, higher = positive). values may be (S, n): one row per seed, all resampled with the
    same items; the statistic is then the mean over the seeds of the per-seed statistic, the number a
    table of seed means reports (for "mean" that is the mean of the seed-averaged items).
    A (pred, gold) tuple as `values` is accepted too (statistic defaults to spearman then)."""
    if gold is None and isinstance(values, tuple) and len(values) == 2:
        values, gold = values
        statistic = "spearman" if statistic == "mean" else statistic
    x = np.asarray(values, dtype=np.float64)
    x = x[None] if x.ndim == 1 else x  # (S, n)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"bootstrap_ci: need (n,) or (seeds, n) values with n >= 2; got shape {np.shape(values)}")
    rng = np.random.default_rng(seed)
    common = dict(n_resamples=n_boot, confidence_level=confidence, method="percentile", vectorized=True,
                  rng=rng, batch=max(1, min(n_boot, 2_000_000 // x.size)))
    with warnings.catch_warnings():  # undefined resamples are handled below; scipy warns of them
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = _bootstrap(x, gold, statistic, common)
    # the percentile interval of the bootstrap distribution, leaving out the resamples where the statistic
    # is undefined (one class only, a constant side): scipy's own interval would be NaN then
    alpha = (1.0 - confidence) / 2
    dist = res.bootstrap_distribution
    if not np.isfinite(dist).any():
        return float("nan"), float("nan")
    lo, hi = np.nanquantile(dist, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _bootstrap(x: np.ndarray, gold, statistic: str, common: dict):
    """scipy.stats.bootstrap of the mean (no gold) or of the mean over seeds of statistic(pred_seed, gold)."""
    if gold is None:
        if statistic != "mean":
            raise ValueError(f"bootstrap_ci: statistic {statistic!r} needs gold=; without it: 'mean'")
        return stats.bootstrap((x.mean(axis=0),), np.mean, **common)
    g = np.asarray(gold, dtype=np.float64)
    if g.shape != x.shape[1:]:
        raise ValueError(f"bootstrap_ci: gold shape {g.shape} != values shape {x.shape[1:]}")
    if statistic not in STATISTICS:
        raise ValueError(f"bootstrap_ci: statistic {statistic!r}; valid with gold: {sorted(STATISTICS)}")
    if statistic in ("spearman", "auc"):  # resample item indices: ranks from counts (the same draws)
        return stats.bootstrap((np.arange(g.shape[0]),), _rank_statistic(x, g, statistic), **common)
    fn = STATISTICS[statistic]

    def seed_mean(gold_resampled, *per_seed, axis=-1):  # every seed sees the same resampled items
        return np.mean([fn(p, gold_resampled, axis=axis) for p in per_seed], axis=0)

    return stats.bootstrap((g, *x), seed_mean, paired=True, **common)
