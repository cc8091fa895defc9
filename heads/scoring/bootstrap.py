"""The two-level (hierarchical) bootstrap of a figure that is a mean over training seeds of a statistic over
items (queries, pairs): both what was trained and what it was scored on vary.

One resample draws S seeds with replacement from the S seeds AND n items with replacement from the n items;
its value is the mean over the drawn seeds of each one's statistic on the drawn items (a seed drawn twice
counts twice). With `minus` (a second system's values at the same seeds, row s of each a pair) a resample's
value is the mean over the drawn seeds of statistic(values[s]) - statistic(minus[s]) on the same items: seeds
are resampled as pairs and items as pairs. The interval is the percentile interval of the resamples' values,
leaving out those where the statistic is undefined (one class only, a constant side).

With one seed this is the items-only bootstrap (`metrics.bootstrap_ci`); with several it adds the spread
between training runs, so an interval that excludes 0 speaks for the method, not for one run of it.
Vectorised: a set of item resamples is drawn as counts (how often each item was drawn) and each seed's
statistic on all of them comes from the counts (`metrics.seed_statistic`: ranks without sorting any
resample), once per system (`item_statistics`); the seed level is a weighted mean of those (`seed_interval`).
"""
from __future__ import annotations

import numpy as np

from headstore.heads.scoring.metrics import STATISTICS, seed_statistic

BATCH_CELLS = 2_000_000  # resamples x items held at once (~16 MB per float64 array): memory bounded, numpy fast
SEED_STREAM = 1  # the seed draws' random stream beside the item draws' (`seed`): independent of them


def two_level_ci(values, n_boot: int = 1000, seed: int = 0, *, gold=None, statistic: str = "mean",
                 confidence: float = 0.95, minus=None) -> tuple[float, float]:
    """Percentile interval of the two-level bootstrap (module doc) of the mean over seeds of `statistic`.

    values: (S, n) per-item values, one row per seed, or (n,) for one seed. gold: (n,) gold scores / 0-1
    labels, needed by "spearman", "pearson" and "auc" (not by "mean"). minus: (S, n) a reference's values,
    row s at the same seed as values' row s (broadcast a seed-independent row before calling)."""
    boot = item_statistics(values, n_boot, seed, gold=gold, statistic=statistic)
    if minus is not None:
        if np.atleast_2d(minus).shape != np.atleast_2d(values).shape:
            raise ValueError(f"two_level_ci: minus shape {np.shape(minus)} != values shape {np.shape(values)} "
                             "(the same seeds and items)")
        boot = boot - item_statistics(minus, n_boot, seed, gold=gold, statistic=statistic)
    return seed_interval(boot, seed, confidence)


def item_statistics(values, n_boot: int = 1000, seed: int = 0, *, gold=None, statistic: str = "mean") -> np.ndarray:
    """(S, n_boot): each seed's statistic on each of n_boot resamples of the n items (drawn with replacement).

    The resamples depend only on (n, n_boot, seed): two systems scored on the same items get the same ones,
    so subtracting their results pairs the items. Batched (BATCH_CELLS) to bound memory."""
    x = np.atleast_2d(np.asarray(values, dtype=np.float64))
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"item_statistics: need (n,) or (seeds, n) values with n >= 2; got shape {np.shape(values)}")
    if statistic != "mean" and statistic not in STATISTICS:
        raise ValueError(f"item_statistics: statistic {statistic!r}; valid: {['mean', *STATISTICS]}")
    if (statistic == "mean") != (gold is None):
        raise ValueError(f"item_statistics: statistic {statistic!r} " + (
            "takes no gold=" if gold is not None else "needs gold= (without it: 'mean')"))
    if gold is not None and np.shape(gold) != x.shape[1:]:
        raise ValueError(f"item_statistics: gold shape {np.shape(gold)} != values shape {x.shape[1:]}")
    of_counts = seed_statistic(x, gold, statistic)
    rng, n = np.random.default_rng(seed), x.shape[1]
    batch = max(1, min(n_boot, BATCH_CELLS // n))
    out = []
    for start in range(0, n_boot, batch):
        b = min(batch, n_boot - start)
        draws = rng.integers(0, n, (b, n)) + (np.arange(b) * n)[:, None]
        counts = np.bincount(draws.ravel(), minlength=b * n).reshape(b, n).astype(np.float64)  # (b, n)
        out.append(of_counts(counts))
    return np.concatenate(out, axis=1)


def seed_interval(boot: np.ndarray, seed: int = 0, confidence: float = 0.95) -> tuple[float, float]:
    """The percentile interval over resamples b of the mean of boot[s, b] over S seeds drawn with replacement
    (S = boot's rows: per-seed statistics on item resamples, `item_statistics`, or a difference of two)."""
    S, B = boot.shape
    seeds = np.random.default_rng([seed, SEED_STREAM]).multinomial(S, np.full(S, 1.0 / S), size=B)  # (B, S)
    drawn = np.where(seeds > 0, boot.T, 0.0)  # an undrawn seed's NaN (a constant side) does not count
    dist = (seeds * drawn).sum(1) / S  # a drawn seed's NaN does: that resample is left out below
    if not np.isfinite(dist).any():
        return float("nan"), float("nan")
    alpha = (1.0 - confidence) / 2
    lo, hi = np.nanquantile(dist, [alpha, 1 - alpha])
    return float(lo), float(hi)
