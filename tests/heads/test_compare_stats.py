"""cli compare's statistics against independent references: the two-level (seeds and items) bootstrap CI of
a seed-mean figure and of the paired-by-seed difference from frozen + head, checked with a plain resampling
loop (numpy, scipy.stats.spearmanr, a pairwise-count AUC) for the mean (IR), Spearman (STS) and AUC (pairs);
the verdict on constructed cases; the pairing of rows by seed in build_rows."""
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from headstore.heads.experiments.compare.setups import REFERENCE, Built
from headstore.heads.experiments.compare.table import build_rows, figure, paired, statistic_of, tables
from headstore.heads.kinds import KINDS, PREFIX, kind_of_metric
from headstore.heads.scoring.bootstrap import item_statistics, two_level_ci
from headstore.heads.scoring.metrics import bootstrap_ci

N_BOOT = 4000


def _auc(p, y):
    """Mann-Whitney by counting pairs: P(a positive outscores a negative), ties half."""
    pos, neg = p[y > 0.5], p[y <= 0.5]
    if not len(pos) or not len(neg):
        return np.nan
    return (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()


STAT = {"mean": lambda p, g: p.mean(), "spearman": lambda p, g: stats.spearmanr(p, g)[0], "auc": _auc}


def _two_level_loop(statistic, values, gold, minus=None, n_boot=2000, seed=11):
    """Reference: per resample draw S seeds and n items with replacement; the mean over the drawn seeds of
    statistic(seed's values on the drawn items) [- the same of `minus` at that seed]. (interval, spread)."""
    rng = np.random.default_rng(seed)
    S, n = values.shape
    out = []
    for _ in range(n_boot):
        seeds, i = rng.integers(0, S, S), rng.integers(0, n, n)
        g = None if gold is None else gold[i]
        out.append(np.mean([STAT[statistic](values[s, i], g) - (0 if minus is None else STAT[statistic](minus[s, i], g))
                            for s in seeds]))
    return np.nanpercentile(out, [2.5, 97.5]), np.nanstd(out)


def _world(statistic, n, rng):
    """(gold, reference (3, n), setup (3, n)) whose seeds differ clearly: the seed level matters."""
    if statistic == "mean":  # per-query nDCG-like values, a seed offset each
        base = rng.uniform(0, 1, n)
        ref = base + np.array([0, .04, .08])[:, None] + rng.normal(0, .05, (3, n))
        return None, ref, ref + np.array([.03, -.02, .05])[:, None] + rng.normal(0, .05, (3, n))
    if statistic == "spearman":  # -E of graded pairs, noisier at some seeds
        gold = rng.uniform(0, 5, n)
        noise = lambda scales: gold + rng.normal(0, 1, (3, n)) * np.array(scales)[:, None]  # noqa: E731
        return gold, noise([1, 2, 3]), noise([.8, 2.5, 2.0])
    gold = (rng.uniform(size=n) < .4).astype(float)  # labelled pairs
    noise = lambda scales: gold + rng.normal(0, 1, (3, n)) * np.array(scales)[:, None]  # noqa: E731
    return gold, noise([.6, 1.2, 2.]), noise([.5, 1.5, 1.5])


def _gold(statistic, gold):
    return None if statistic == "mean" else gold


@pytest.mark.parametrize("statistic", ["mean", "spearman", "auc"])
def test_the_figure_ci_is_a_two_level_bootstrap_like_a_plain_loop(statistic):
    gold, _, setup = _world(statistic, 120, np.random.default_rng(0))
    per_seed = [STAT[statistic](p, gold) for p in setup]
    f = figure(per_seed, item_statistics(setup, N_BOOT, gold=_gold(statistic, gold), statistic=statistic))
    (lo, hi), spread = _two_level_loop(statistic, setup, gold)
    assert f["mean"] == pytest.approx(np.mean(per_seed)) and f["std"] == pytest.approx(np.std(per_seed, ddof=1))
    assert f["ci"] == pytest.approx([lo, hi], abs=0.3 * spread)
    # the items-only interval (the seeds held fixed) is far narrower: the loop tells the two apart
    items_only = bootstrap_ci(setup, N_BOOT, gold=_gold(statistic, gold), statistic=statistic)
    assert items_only[1] - items_only[0] < 0.75 * (hi - lo)


@pytest.mark.parametrize("statistic", ["mean", "spearman", "auc"])
def test_the_paired_difference_resamples_seeds_and_items_as_pairs_like_a_plain_loop(statistic):
    gold, ref, setup = _world(statistic, 120, np.random.default_rng(1))
    g = _gold(statistic, gold)
    per_seed, ref_seed = [STAT[statistic](p, gold) for p in setup], [STAT[statistic](p, gold) for p in ref]
    d = paired(per_seed, item_statistics(setup, N_BOOT, gold=g, statistic=statistic),
               ref_seed, item_statistics(ref, N_BOOT, gold=g, statistic=statistic))
    (lo, hi), spread = _two_level_loop(statistic, setup, gold, minus=ref)
    assert d["diff"] == pytest.approx(np.mean(np.subtract(per_seed, ref_seed)))
    assert d["ci"] == pytest.approx([lo, hi], abs=0.3 * spread)
    assert d["ci"] == pytest.approx(two_level_ci(setup, N_BOOT, gold=g, statistic=statistic, minus=ref))


def _better(per_seed_shift, n=300, seed=2):
    """Per-query values of frozen + head (3 seeds, queries far more spread than seeds) and a setup shifted by
    `per_seed_shift` at each seed (plus a little noise)."""
    rng = np.random.default_rng(seed)
    ref = rng.uniform(0, 1, n)[None] + rng.normal(0, 0.02, (3, n))
    setup = ref + np.asarray(per_seed_shift)[:, None] + rng.normal(0, 0.005, (3, n))
    return setup, ref


def _paired_mean(setup, ref, n_boot=1000):
    return paired(list(setup.mean(1)), item_statistics(setup, n_boot), list(ref.mean(1)), item_statistics(ref, n_boot))


def test_a_setup_better_on_every_seed_and_query_excludes_zero():
    setup, ref = _better([0.02, 0.03, 0.025])
    setup = np.maximum(setup, ref + 1e-3)  # better on every query at every seed
    d = _paired_mean(setup, ref)
    assert d["excludes_zero"] and 0 < d["ci"][0] <= d["diff"] <= d["ci"][1]


def test_a_setup_better_on_one_seed_only_does_not_exclude_zero_though_the_items_only_ci_did():
    setup, ref = _better([0.09, -0.005, 0.0])  # one good training run, two that did nothing
    d = _paired_mean(setup, ref)
    assert d["diff"] == pytest.approx(0.085 / 3, abs=2e-3)
    assert not d["excludes_zero"] and d["ci"][0] < 0 < d["ci"][1]
    # the old definition: the items resampled, the trained models held fixed -> "excludes 0"
    old = bootstrap_ci(setup, 1000, minus=ref)
    assert old[0] > 0.02


def test_pairing_by_seed_cancels_what_a_seed_gives_both():
    """Seed s's frozen + head is where seed s's tuned row starts: a seed effect both share cancels when each
    seed is set against its own reference, so a small consistent gain shows."""
    seed_effect = np.array([0.0, 0.1, 0.2])
    setup, ref = _better([0.01] * 3, seed=3)
    ref, setup = ref + seed_effect[:, None], setup + seed_effect[:, None]
    d = _paired_mean(setup, ref)
    assert d["excludes_zero"] and d["ci"][0] > 0.005
    crossed = _paired_mean(setup, ref[[1, 2, 0]])  # seeds set against another seed's reference: lost in the spread
    assert not crossed["excludes_zero"]


def _record(kind, statistic, gold, head, cosine):
    """An eval record as compare_report._eval writes it: the kind's metric names, figures, per-item values."""
    stat = lambda v: float(STAT[statistic](v, gold))  # noqa: E731
    return {"metric": kind.primary_metric("l1"), "value": stat(head), "baseline_metric": kind.primary_metric("cosine"),
            "baseline": stat(cosine), "items": {"head": list(head), "baseline": list(cosine)},
            "gold": None if gold is None else list(gold)}


def _report_world(statistic: str, n=150):
    """built / evals / steps of a compare run with frozen + head at seeds 0, 1, 2, a fine-tuned encoder at
    seed 0 only (tune_seeds = 1) and the frozen cosine; values from `_world`."""
    kind = next(k for k in KINDS.values() if k.statistic == statistic)
    rng = np.random.default_rng(4)
    gold, ref, setup = _world(statistic, n, rng)
    cosine = ref[0] + rng.normal(0, .3, n)
    base = {s: Built("base", None, "store", None, {"trained": "h"}, [f"head-s{s}"], {None: 0, "trained": 10})
            for s in (0, 1, 2)}
    tuned = Built("finetuned", 0, "store-ft", "enc", {"joint": "h"}, ["ft-s0"], {None: 99, "joint": 109})
    evals = {("base", s, "ind"): _record(kind, statistic, gold, ref[s], cosine) for s in (0, 1, 2)}
    evals["finetuned", 0, "ind"] = _record(kind, statistic, gold, setup[0], setup[1])
    steps = SimpleNamespace(seconds={n: 1.0 for n in ("head-s0", "head-s1", "head-s2", "ft-s0")}, peak_mb={})
    cfg = SimpleNamespace(in_domain="ind", out_of_domain=(), n_boot=500,
                          setups=("frozen-cosine", REFERENCE, "finetuned-cosine", "finetuned-head"))
    return cfg, {"base": base, "finetuned": {0: tuned}}, evals, steps, (gold, ref, setup, cosine)


@pytest.mark.parametrize("statistic", ["mean", "spearman", "auc"])
def test_build_rows_pairs_a_tuned_row_with_its_own_seed_and_the_frozen_cosine_with_every_seed(statistic):
    cfg, built, evals, steps, (gold, ref, setup, cosine) = _report_world(statistic)
    rows = {r["setup"]: r for r in build_rows(cfg, built, evals, {}, steps)}
    stat = lambda v: STAT[statistic](v, gold)  # noqa: E731
    ref_seed = [stat(r) for r in ref]
    tuned = rows["finetuned-head"]["datasets"]["ind"]
    assert rows["finetuned-head"]["seeds"] == [0] and tuned["vs_frozen_head"]["seeds"] == [0]
    # seed 0's tuned figure against seed 0's frozen + head, not against the mean over the three seeds
    assert tuned["vs_frozen_head"]["diff"] == pytest.approx(stat(setup[0]) - ref_seed[0])
    cos = rows["frozen-cosine"]["datasets"]["ind"]
    assert rows["frozen-cosine"]["seeds"] == [0] and cos["vs_frozen_head"]["seeds"] == [0, 1, 2]
    assert cos["vs_frozen_head"]["diff"] == pytest.approx(stat(cosine) - np.mean(ref_seed))
    # the cosine row's CI: its one instance broadcast against every reference seed, seeds and items resampled
    g = _gold(statistic, gold)
    want = two_level_ci(np.repeat(cosine[None], 3, 0), 500, gold=g, statistic=statistic, minus=ref)
    assert cos["vs_frozen_head"]["ci"] == pytest.approx(list(want))
    frozen = rows[REFERENCE]["datasets"]["ind"]
    assert frozen["ci"] == pytest.approx(list(two_level_ci(ref, 500, gold=g, statistic=statistic)))
    assert "vs_frozen_head" not in frozen and frozen["mean"] == pytest.approx(np.mean(ref_seed))


def test_each_kind_names_the_statistic_of_its_primary_metric():
    for kind in KINDS.values():
        for energy in PREFIX:
            assert kind_of_metric(kind.primary_metric(energy)) is kind
    assert [statistic_of(m) for m in ("spearman_manhattan", "manhattan_ndcg@10", "manhattan_auc", "cosine_auc",
                                      "cosine_knn_accuracy")] == ["spearman", "mean", "auc", "auc", "mean"]
    with pytest.raises(ValueError, match="manhattan_auc"):  # the error lists the valid names
        statistic_of("auc_cosine")


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="minus"):
        bootstrap_ci(np.ones((1, 5)), gold=np.arange(5.0), statistic="pearson", minus=np.ones((1, 5)))
    with pytest.raises(ValueError, match="same items"):
        bootstrap_ci(np.ones((1, 5)), minus=np.ones((1, 6)))
    with pytest.raises(ValueError, match="same seeds and items"):
        two_level_ci(np.ones((3, 5)), minus=np.ones((2, 5)))
    with pytest.raises(ValueError, match="needs gold"):
        two_level_ci(np.ones((3, 5)), statistic="auc")
    with pytest.raises(ValueError, match="valid"):
        item_statistics(np.ones((3, 5)), gold=np.ones(5), statistic="kendall")


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
    assert "two-level" in md and "same seed" in md  # the notes say how the CIs were made

