"""Evaluation metrics: STS correlations, pair classification, and bootstrap confidence intervals. Energies:
lower = better everywhere. The IR metrics (one top-k pass sliced per k, trec_eval's definitions) are in
heads.scoring.ir_metrics.

Confidence intervals: `scipy.stats.bootstrap`, percentile method, resampling queries or pairs; with
several inputs (gold and predictions, or one prediction per seed) the resampling is paired.
"""
from __future__ import annotations

import hashlib
import warnings

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

from headstore.heads.scoring.ir_metrics import (  # noqa: F401  (importable from here, as before the split)
    EnergySource, ir_metrics_per_query, ndcg_and_ap, topk_ranking, trec_tie_order)


def sts_metrics(scores_pred, gold, pearson: bool = True) -> dict[str, float]:
    """Pearson and Spearman correlation of predicted similarities with gold scores (Spearman alone without
    `pearson`: what an epoch's selection reads).

    Pass a similarity (higher = more similar), e.g. -energy: correlation signs follow it."""
    pred, gold = np.asarray(scores_pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if pred.shape != gold.shape or pred.ndim != 1 or len(pred) < 2:
        raise ValueError(f"sts_metrics: need two 1-D arrays of equal length >= 2; got {pred.shape}, {gold.shape}")
    out = {"pearson": float(stats.pearsonr(pred, gold)[0])} if pearson else {}
    return out | {"spearman": float(stats.spearmanr(pred, gold)[0])}


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
    below + 1 .. below + c, below = the drawn items of lower groups: their mean is cumsum - (c - 1) / 2.
    Every number is a count or a half-integer, exact in float64 whatever the order of the sums, so torch's
    kernels (faster than numpy's cumsum and fancy indexing, and free of the GIL) give numpy's very numbers."""
    w, g = torch.from_numpy(counts), torch.from_numpy(group)
    if n_groups < len(group):  # the items of a group summed: (B, n_groups)
        per_group = w.new_zeros((w.shape[0], n_groups)).index_add_(1, g, w)
    else:  # (B, n) in increasing value
        per_group = w.index_select(1, torch.from_numpy(np.argsort(group, kind="stable")))
    average = torch.cumsum(per_group, 1)
    average.sub_(per_group.sub_(1).div_(2))
    return average.index_select(1, g).numpy()


def _weighted_pearson(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Pearson of rows of a and b where item i counts w[:, i] times: (B, n) -> (B,)."""
    n = w.sum(1, keepdims=True)
    a = a - (w * a).sum(1, keepdims=True) / n
    b = b - (w * b).sum(1, keepdims=True) / n
    with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
        return (w * a * b).sum(1) / np.sqrt((w * a * a).sum(1) * (w * b * b).sum(1))


class _WeightedSide:
    """One side b (B, n) of `_weighted_pearson` under weights w, centred once: several a's correlate with it (the
    gold's ranks against each seed's) in the same operations, so in the same numbers, as `_weighted_pearson`."""

    def __init__(self, b: np.ndarray, w: np.ndarray):
        self.w, self.n = w, w.sum(1, keepdims=True)
        self.b = b - (w * b).sum(1, keepdims=True) / self.n
        self.bb = (w * self.b * self.b).sum(1)

    def pearson(self, a: np.ndarray) -> np.ndarray:
        """`_weighted_pearson(a, b, w)`: (w * a * b) is ((w * a) * b), so w * a is formed once."""
        a = a - (self.w * a).sum(1, keepdims=True) / self.n
        wa = self.w * a
        with np.errstate(invalid="ignore", divide="ignore"):  # a constant resample has no correlation: NaN
            return (wa * self.b).sum(1) / np.sqrt((wa * a).sum(1) * self.bb)


_GOLD_SIDES: list[tuple[bytes, np.ndarray, _WeightedSide]] = []  # the last few (gold, counts, its side)
GOLD_SIDES_KEPT = 3  # a grid's leaderboard bootstraps every configuration on the same gold and draws (STS-B's test:
# 3 batches of resamples), kept across calls: at most 3 x 2 arrays of one batch (<= 2e6 floats, 16 MB, each)


def _gold_side(gold_key: bytes, gold_groups: tuple, counts: np.ndarray) -> _WeightedSide:
    """The gold's ranks in the resamples `counts`, centred (`_WeightedSide`): made once for a gold and a set of
    draws (bootstrap_ci draws the same ones for every call of the same seed and shape), the same numbers."""
    for key, drawn, side in _GOLD_SIDES:
        if key == gold_key and drawn.shape == counts.shape and np.array_equal(drawn, counts):
            return side
    side = _WeightedSide(_resample_ranks(*gold_groups, counts), counts.copy())
    _GOLD_SIDES.insert(0, (gold_key, side.w, side))
    del _GOLD_SIDES[GOLD_SIDES_KEPT:]
    return side


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
    gold_key = hashlib.sha1(g.tobytes()).digest()

    def spearman(counts: np.ndarray) -> np.ndarray:  # Pearson of the ranks, each item weighted by its count
        gold_side = _gold_side(gold_key, gold_groups, counts)
        return np.stack([gold_side.pearson(_resample_ranks(*p, counts)) for p in preds])

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
