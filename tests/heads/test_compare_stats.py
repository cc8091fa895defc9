"""cli compare's statistics against independent references: the seed-mean figure's CI and the paired
difference from frozen + head (bootstrap over items, pooled over seeds), checked with plain resampling
loops (numpy, scipy.stats.spearmanr); the sign and the "excludes 0" verdict on constructed cases."""
import numpy as np
import pytest
from scipy import stats

from headstore.heads.experiments.compare_table import figure, paired, statistic_of, tables
from headstore.heads.scoring.metrics import bootstrap_ci

N_BOOT = 4000


def _loop_ci(stat, n: int, n_boot: int = N_BOOT, seed: int = 7) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    values = np.array([stat(rng.integers(0, n, n)) for _ in range(n_boot)])
    values = values[np.isfinite(values)]
    return tuple(np.percentile(values, [2.5, 97.5]))


def _close(a, b, tol):
    assert a == pytest.approx(b, abs=tol), (a, b)


def test_paired_mean_difference_matches_a_loop():
    rng = np.random.default_rng(0)
    n = 120
    ref = rng.uniform(0, 1, (3, n))  # frozen + head: three seeds, per-query nDCG
    setup = np.clip(ref[:2] + rng.normal(0.03, 0.1, (2, n)), 0, 1)  # two seeds
    got = paired(list(setup.mean(1)), setup, list(ref.mean(1)), ref, None, "mean", N_BOOT)
    want = _loop_ci(lambda idx: setup[:, idx].mean() - ref[:, idx].mean(), n)
    _close(got["diff"], setup.mean() - ref.mean(), 1e-12)
    _close(got["ci"][0], want[0], 0.006)
    _close(got["ci"][1], want[1], 0.006)


def test_paired_spearman_difference_matches_a_loop():
    rng = np.random.default_rng(1)
    n = 100
    gold = rng.uniform(0, 5, n)
    ref = gold[None] + rng.normal(0, 2.0, (2, n))  # two seeds of -E, frozen + head
    setup = gold[None] + rng.normal(0, 1.0, (2, n))  # closer to the gold: a higher Spearman
    per_seed = [stats.spearmanr(p, gold)[0] for p in setup]
    ref_seed = [stats.spearmanr(p, gold)[0] for p in ref]
    got = paired(per_seed, setup, ref_seed, ref, gold, "spearman", N_BOOT)
    idx = np.random.default_rng(7).integers(0, n, (N_BOOT, n))  # the loop's resamples, all at once

    def spearman(pred):  # (B,) Spearman of each resample: Pearson of average ranks
        a, b = stats.rankdata(pred[idx], axis=1), stats.rankdata(gold[idx], axis=1)
        a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
        return (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))

    diffs = np.mean([spearman(p) for p in setup], axis=0) - np.mean([spearman(p) for p in ref], axis=0)
    want = np.percentile(diffs, [2.5, 97.5])
    assert got["diff"] > 0
    _close(got["diff"], np.mean(per_seed) - np.mean(ref_seed), 1e-12)
    _close(got["ci"][0], want[0], 0.015)
    _close(got["ci"][1], want[1], 0.015)


@pytest.mark.parametrize("shift, verdict", [(0.03, "above"), (0.0, "spans"), (-0.03, "below")])
def test_the_paired_difference_has_the_sign_and_verdict_of_a_constructed_case(shift, verdict):
    """Items far more spread between queries than between setups: only pairing can see a small shift."""
    rng = np.random.default_rng(2)
    n = 300
    query_difficulty = rng.uniform(0, 1, n)
    ref = np.clip(query_difficulty[None] + rng.normal(0, 0.02, (3, n)), 0, 1)
    setup = np.clip(query_difficulty[None] + shift + rng.normal(0, 0.02, (3, n)), -1, 2)
    d = paired(list(setup.mean(1)), setup, list(ref.mean(1)), ref, None, "mean", 1000)
    assert d["ci"][0] <= d["diff"] <= d["ci"][1]
    assert d["excludes_zero"] == (verdict != "spans")
    assert {"above": d["ci"][0] > 0, "spans": d["ci"][0] < 0 < d["ci"][1], "below": d["ci"][1] < 0}[verdict]
    # unpaired, the two figures' own CIs overlap widely: the paired test is what decides
    a, b = figure(list(setup.mean(1)), setup, None, "mean", 1000), figure(list(ref.mean(1)), ref, None, "mean", 1000)
    assert a["ci"][0] < b["ci"][1] and b["ci"][0] < a["ci"][1]


def test_figure_is_the_seed_mean_with_its_std_and_a_loop_ci():
    rng = np.random.default_rng(3)
    items = rng.uniform(0, 1, (3, 80))
    per_seed = list(items.mean(1))
    f = figure(per_seed, items, None, "mean", N_BOOT)
    _close(f["mean"], np.mean(per_seed), 1e-12)
    _close(f["std"], np.std(per_seed, ddof=1), 1e-12)
    want = _loop_ci(lambda idx: items[:, idx].mean(), 80)
    _close(f["ci"][0], want[0], 0.006)
    _close(f["ci"][1], want[1], 0.006)


def test_minus_is_refused_where_it_is_not_defined():
    with pytest.raises(ValueError, match="minus"):
        bootstrap_ci(np.ones((1, 5)), gold=np.arange(5.0), statistic="pearson", minus=np.ones((1, 5)))
    with pytest.raises(ValueError, match="same items"):
        bootstrap_ci(np.ones((1, 5)), minus=np.ones((1, 6)))
    assert [statistic_of(m) for m in ("spearman_manhattan", "manhattan_ndcg@10", "auc_cosine")] == \
        ["spearman", "mean", "auc"]


def test_the_tables_mark_the_differences_whose_ci_excludes_zero():
    def block(mean, diff=None, lo=None, hi=None):
        b = {"metric": "manhattan_ndcg@10", "mean": mean, "std": 0.01, "ci": [mean - 0.02, mean + 0.02]}
        if diff is not None:
            b["vs_frozen_head"] = {"diff": diff, "ci": [lo, hi], "excludes_zero": lo > 0 or hi < 0}
        return b

    rows = [{"label": "frozen encoder + head", "seeds": [0, 1, 2], "trainable_parameters": 10, "seconds": 5.0,
             "peak_mb": 100.0, "mlm_loss": None, "datasets": {"sci": block(0.7), "cran": block(0.3)}},
            {"label": "LoRA + head", "seeds": [0, 1, 2], "trainable_parameters": 99, "seconds": 50.0, "peak_mb": None,
             "mlm_loss": None, "datasets": {"sci": block(0.75, 0.05, 0.01, 0.09), "cran": block(0.29, -0.01, -0.03, 0.01)}}]

    class Cfg:
        in_domain, out_of_domain, ood_exclude_overlap, seeds, tune_seeds, n_boot = "sci", ("cran",), True, (0, 1, 2), None, 1000

    terminal, md = tables(Cfg, rows)
    lora = next(line for line in terminal.splitlines() if line.startswith("LoRA"))
    assert "+0.0500 [0.0100, 0.0900] *" in lora and "-0.0100 [-0.0300, 0.0100]" in lora
    assert "-0.0100 [-0.0300, 0.0100] *" not in md and "(reference)" in md and "0.7500 ± 0.0100" in md


def test_settled_asks_whether_the_second_half_of_the_run_still_lowered_the_loss():
    from headstore.heads.experiments.compare_setups import settled

    curve = lambda losses: [{"step": 10 * (i + 1), "loss": v} for i, v in enumerate(losses)]  # noqa: E731
    # flat at the end (a decaying lr flattens any curve there) but 3% lower than mid-run: not settled
    assert settled(curve([8.98, 7.65, 7.4, 7.4, 7.44, 7.33, 7.31, 7.26, 7.22, 7.22])) == (False, pytest.approx(0.0301, abs=1e-3))
    assert settled(curve([9.0, 5.0, 4.0, 4.01, 3.99, 3.98, 3.97, 3.96]))[0]
    assert settled(curve([9.0, 5.0])) == (False, None)  # too short to say
