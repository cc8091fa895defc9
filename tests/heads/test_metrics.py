import math

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import ndcg_score

from headstore.heads.scoring.ir_metrics import ir_metrics_per_query, ndcg_and_ap, topk_ranking
from headstore.heads.scoring.metrics import bootstrap_ci, pair_metrics, sts_metrics


def ir_means(ranked, qrels, ks=(1, 10, 100), **kw) -> dict[str, float]:
    """Each IR metric's mean over the scored queries."""
    _, per_query = ir_metrics_per_query(ranked, qrels, ks, **kw)
    return {n: float(v.mean()) for n, v in per_query.items()}


def random_ir(Q=12, N=40, seed=0):
    rng = np.random.default_rng(seed)
    energies = torch.tensor(rng.random((Q, N)))  # continuous: no ties
    grades = rng.choice([0, 0, 0, 0, 1, 2, 3], size=(Q, N))
    grades[0] = 0
    grades[0, 5] = 2  # every scored query needs a relevant doc; query 0 has exactly one
    doc_ids = np.array([f"d{j}" for j in range(N)])
    qids = [f"q{i}" for i in range(Q)]
    qrels = {qids[i]: {doc_ids[j]: int(grades[i, j]) for j in range(N) if grades[i, j] > 0 or j % 7 == 0}
             for i in range(Q)}  # also judged-0 docs, which must count as non-relevant
    return energies, grades, doc_ids, qids, qrels


def brute(ranked, rel_set, k):
    """MRR@k, recall@k, AP@k by loops."""
    mrr = 0.0
    for r, d in enumerate(ranked[:k], start=1):
        if d in rel_set:
            mrr = 1.0 / r
            break
    recall = sum(d in rel_set for d in ranked[:k]) / len(rel_set)
    hits, ap = 0, 0.0
    for r, d in enumerate(ranked[:k], start=1):
        if d in rel_set:
            hits += 1
            ap += hits / r
    return mrr, recall, ap / len(rel_set)


def test_chunked_topk_equals_full_sort():
    E = torch.randn(37, 50)
    full = torch.argsort(E, dim=1)[:, :10]
    assert torch.equal(topk_ranking(E, k=10, chunk_size=8), full)
    assert torch.equal(topk_ranking([E[:20], E[20:]], k=10), full)
    assert torch.equal(topk_ranking(lambda s, t: E[s:t], k=10, n_queries=37, chunk_size=5), full)
    assert topk_ranking(E, k=500).shape == (37, 50)
    idx, val = topk_ranking(E, k=3, return_energies=True)
    torch.testing.assert_close(val, torch.gather(E, 1, idx))


def test_topk_exclude():
    E = torch.randn(5, 5)
    idx = topk_ranking(E, k=4, exclude=[[i] for i in range(5)])
    for i in range(5):
        assert i not in idx[i].tolist()
        assert idx[i].tolist() == [j for j in torch.argsort(E[i]).tolist() if j != i]


def test_ndcg_matches_sklearn():
    energies, grades, doc_ids, qids, qrels = random_ir()
    idx = topk_ranking(energies, k=40)
    _, per = ir_metrics_per_query(idx, qrels, ks=(1, 10, 40), query_ids=qids, doc_ids=doc_ids)
    assert len(per["ndcg@10"]) == 12
    for i in range(12):
        expected = ndcg_score(grades[i:i + 1], -energies[i:i + 1].numpy(), k=10)
        assert per["ndcg@10"][i] == pytest.approx(expected, rel=1e-9)
    assert per["ndcg@10"].mean() == pytest.approx(np.mean(
        [ndcg_score(grades[i:i + 1], -energies[i:i + 1].numpy(), k=10) for i in range(12)]))


def test_mrr_recall_map_match_brute_force():
    energies, grades, doc_ids, qids, qrels = random_ir(seed=1)
    idx = topk_ranking(energies, k=25)  # run depth 25 < N: metrics at 100 see only 25 docs
    scored, per = ir_metrics_per_query(idx, qrels, ks=(1, 10, 100), query_ids=qids, doc_ids=doc_ids)
    assert scored == qids
    for i, q in enumerate(qids):
        ranked = [doc_ids[j] for j in idx[i].tolist()]
        rel = {d for d, g in qrels[q].items() if g > 0}
        for k in (1, 10, 100):
            mrr, recall, ap = brute(ranked, rel, k)
            assert per[f"mrr@{k}"][i] == pytest.approx(mrr)
            assert per[f"recall@{k}"][i] == pytest.approx(recall)
        assert per["map@100"][i] == pytest.approx(brute(ranked, rel, 100)[2])


def test_graded_qrels_and_hand_ndcg():
    qrels = {"q": {"a": 1, "b": 2, "c": 0, "x": -1}}
    # ranking b, a: ideal order -> 1.0
    assert ir_means({"q": ["b", "a", "c"]}, qrels)["ndcg@10"] == pytest.approx(1.0)
    # ranking c, a, b: dcg = 1/log2(3) + 2/log2(4); idcg = 2 + 1/log2(3)
    got = ir_means({"q": ["c", "a", "b", "x"]}, qrels)
    assert got["ndcg@10"] == pytest.approx((1 / math.log2(3) + 2 / 2) / (2 + 1 / math.log2(3)))
    assert got["mrr@10"] == pytest.approx(0.5)
    assert got["recall@1"] == 0.0 and got["recall@10"] == 1.0
    # negative grade is non-relevant: x first changes nothing but ranks
    only_x = ir_means({"q": ["x"]}, qrels)
    assert only_x["ndcg@10"] == 0.0 and only_x["mrr@10"] == 0.0


def test_all_zero_grade_queries_score_zero_and_count_unjudged_queries_do_not():
    """trec_eval: a query judged with nothing relevant scores 0 and is in the mean; an unjudged one is not."""
    qrels = {"q1": {"a": 1}, "q2": {"b": 0}}
    scored, per = ir_metrics_per_query({"q1": ["a"], "q2": ["b"], "q3": ["a"]}, qrels)
    assert scored == ["q1", "q2"] and per["ndcg@10"].tolist() == [1.0, 0.0]
    means = ir_means({"q1": ["a"], "q2": ["b"], "q3": ["a"]}, qrels)
    assert means["ndcg@10"] == 0.5 and means["recall@10"] == 0.5 and means["map@100"] == 0.5
    with pytest.raises(ValueError, match="no ranked query"):
        ir_metrics_per_query({"q3": ["b"]}, qrels)
    with pytest.raises(ValueError, match="twice"):
        ir_metrics_per_query({"q1": ["a", "a"]}, qrels)
    with pytest.raises(ValueError, match="doc_ids"):
        ir_metrics_per_query(np.array([[0]]), qrels, query_ids=["q1"])


def test_sts_metrics():
    rng = np.random.default_rng(0)
    gold = rng.random(50)
    pred = gold + 0.3 * rng.standard_normal(50)
    got = sts_metrics(pred, gold)
    assert got["pearson"] == pytest.approx(np.corrcoef(pred, gold)[0, 1])
    rank = lambda v: np.argsort(np.argsort(v))
    assert got["spearman"] == pytest.approx(np.corrcoef(rank(pred), rank(gold))[0, 1])


def pair_sweep_loop(e: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Reference for pair_metrics: try every energy t as threshold (predict positive iff energy <= t),
    lowest first, keeping the first best; "nothing positive" (threshold min - 1) wins accuracy only when
    strictly better than every threshold."""
    n, n_pos = len(y), int(y.sum())
    best = {"accuracy": -1.0, "f1": -1.0}
    for t in sorted(set(e.tolist())):
        tp, fp = int(np.sum((e <= t) & (y == 1))), int(np.sum((e <= t) & (y == 0)))
        for name, value in (("accuracy", (tp + (n - n_pos - fp)) / n), ("f1", 2 * tp / (2 * tp + fp + (n_pos - tp)))):
            if value > best[name]:
                best[name], best[f"{name}_threshold"] = value, t
    if (n - n_pos) / n > best["accuracy"]:
        best["accuracy"], best["accuracy_threshold"] = (n - n_pos) / n, float(e.min()) - 1.0
    return best


def random_pairs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Energies and labels of one of four kinds: continuous, rounded (ties), few levels, all tied."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 120))
    y = rng.integers(0, 2, n)
    y[:2] = (0, 1)  # both classes
    e = [rng.random(n) + 0.5 * (1 - y), np.round(rng.random(n) + 0.3 * (1 - y), 1),
         rng.integers(-2, 2, n).astype(float), np.full(n, 0.25)][seed % 4]
    return e, y


def test_pair_metrics_equal_a_loop_over_thresholds():
    nothing_positive = 0
    for seed in range(400):
        e, y = random_pairs(seed)
        got = pair_metrics(e, y)
        ref = pair_sweep_loop(e, y)
        assert {k: got[k] for k in ref} == ref, seed  # exactly: the same counts, the same divisions
        nothing_positive += got["accuracy_threshold"] < e.min()
        pos, neg = e[y == 1], e[y == 0]
        assert got["auc"] == pytest.approx(np.mean([(p < n) + 0.5 * (p == n) for p in pos for n in neg]), abs=1e-12)
    assert nothing_positive > 0  # the all-negative prediction was the best accuracy somewhere
    got = pair_metrics(np.array([0.0, 1.0, 2.0]), np.array([0, 0, 1]))  # the positive has the highest energy
    assert (got["accuracy"], got["accuracy_threshold"]) == (2 / 3, -1.0)
    assert (got["f1"], got["f1_threshold"]) == (0.5, 2.0)


def test_ndcg_and_ap_by_hand():
    gains = np.array([[0.0, 1.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    ideal = np.array([[1.0, 1.0, 1.0], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # the first has a relevant item unranked
    ndcg, ap = ndcg_and_ap(gains, ideal, np.array([3, 2, 0]), (1, 10))
    assert ndcg[1][:2].tolist() == [0.0, 1.0]
    assert ndcg[10][0] == pytest.approx((1 / math.log2(3) + 1 / 2) / (1 + 1 / math.log2(3) + 1 / 2))
    assert ndcg[10][1] == pytest.approx((2 + 1 / 2) / (2 + 1 / math.log2(3)))
    assert ap[:2] == pytest.approx([(1 / 2 + 2 / 3) / 3, (1 + 2 / 3) / 2])
    assert np.isnan(ndcg[10][2]) and np.isnan(ap[2])  # nothing relevant
    _, ap2 = ndcg_and_ap(gains, ideal, np.array([3, 2, 0]), (10,), ap_depth=2)
    assert ap2[:2] == pytest.approx([(1 / 2) / 3, 1 / 2])


def test_bootstrap_ci():
    rng = np.random.default_rng(3)
    v = rng.random(200)
    lo, hi = bootstrap_ci(v, n_boot=500, seed=1)
    assert lo < v.mean() < hi
    assert (lo, hi) == bootstrap_ci(v, n_boot=500, seed=1)
    se = v.std() / math.sqrt(len(v))
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.2)
    gold = rng.random(80)
    pred = gold + 0.5 * rng.standard_normal(80)
    lo, hi = bootstrap_ci((pred, gold), n_boot=300)
    assert lo < stats.spearmanr(pred, gold)[0] < hi and -1 <= lo < hi <= 1
    assert bootstrap_ci(pred, n_boot=300, gold=gold, statistic="spearman") == (lo, hi)
    with pytest.raises(ValueError, match="gold"):
        bootstrap_ci(v, statistic="spearman")


def _rank(v):
    return np.argsort(np.argsort(v))  # continuous values: no ties


def _spearman_loop(a, b):
    return np.corrcoef(_rank(a), _rank(b))[0, 1]


def _auc_loop(p, y):
    pos, neg = p[y == 1], p[y == 0]
    return (pos[:, None] > neg[None, :]).mean()


def _loop_bootstrap(per_seed, gold, statistic, n_boot=1500, seed=5):
    """Reference: resample pair indices, the same for every seed and the gold; percentile interval."""
    rng = np.random.default_rng(seed)
    n = len(gold)
    values = []
    for _ in range(n_boot):
        i = rng.integers(0, n, n)
        values.append(np.mean([statistic(p[i], gold[i]) for p in per_seed]))
    return np.quantile(values, [0.025, 0.975])


def test_sts_ci_is_the_ci_of_the_mean_over_seeds_not_of_a_seed_ensemble():
    rng = np.random.default_rng(4)
    gold = rng.standard_normal(400)
    per_seed = np.stack([gold + rng.standard_normal(400) for _ in range(3)])  # three noisy seeds
    reported = np.mean([stats.spearmanr(p, gold)[0] for p in per_seed])
    ensemble = stats.spearmanr(per_seed.mean(0), gold)[0]  # averaging predictions removes noise: higher
    lo, hi = bootstrap_ci(per_seed, gold=gold, statistic="spearman", n_boot=1500)
    assert lo < reported < hi and not lo < ensemble < hi
    ref = _loop_bootstrap(per_seed, gold, _spearman_loop)
    assert (lo, hi) == pytest.approx(tuple(ref), abs=0.015)


def test_auc_ci_pairs_scores_with_their_labels():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 2, 300).astype(float)
    per_seed = np.stack([labels + 1.5 * rng.standard_normal(300) for _ in range(2)])
    lo, hi = bootstrap_ci(per_seed, gold=labels, statistic="auc", n_boot=1500)
    from sklearn.metrics import roc_auc_score

    reported = np.mean([roc_auc_score(labels, p) for p in per_seed])
    assert lo < reported < hi
    ref = _loop_bootstrap(per_seed, labels, _auc_loop)
    assert (lo, hi) == pytest.approx(tuple(ref), abs=0.015)
    tiny = bootstrap_ci(np.array([0.1, 0.9, 0.2]), gold=np.array([0.0, 1.0, 0.0]), statistic="auc", n_boot=200)
    assert all(np.isfinite(tiny))  # resamples with one class only are left out, not turned into NaN


def test_ir_ci_over_seeds_is_the_ci_of_the_seed_averaged_queries():
    rng = np.random.default_rng(8)
    per_seed = rng.random((3, 150))
    assert bootstrap_ci(per_seed, n_boot=500) == bootstrap_ci(per_seed.mean(0), n_boot=500)
    lo, hi = bootstrap_ci(per_seed, n_boot=1500)
    ref = _loop_bootstrap(per_seed, np.zeros(150), lambda p, _: p.mean())
    assert (lo, hi) == pytest.approx(tuple(ref), abs=0.01)


def test_resample_ranks_from_counts_equal_rankdata_of_the_resample():
    from scipy.stats import rankdata

    from headstore.heads.scoring.metrics import _resample_ranks, _tie_groups

    rng = np.random.default_rng(3)
    values = np.round(rng.normal(size=40), 1)  # many ties
    group, n_groups = _tie_groups(values)
    draws = rng.integers(0, 40, size=(5, 40))  # five resamples (item indices)
    counts = np.stack([np.bincount(d, minlength=40) for d in draws]).astype(float)
    ranks = _resample_ranks(group, n_groups, counts)  # (5, 40): the rank each item has in each resample
    for d, r in zip(draws, ranks):
        np.testing.assert_allclose(r[d], rankdata(values[d]))


def test_spearman_statistic_of_counts_equals_the_weighted_pearson_of_rankdata_bit_for_bit():
    """seed_statistic's spearman (torch ranks, the gold's side kept across calls) against a plain reference: each
    resample's ranks by scipy's rankdata, `_weighted_pearson` of them; the same bits (every sum is exact)."""
    from scipy.stats import rankdata

    from headstore.heads.scoring.metrics import _weighted_pearson, seed_statistic

    rng = np.random.default_rng(11)
    n = 60
    golds = [np.round(rng.uniform(0, 5, n)), rng.standard_normal(n)]  # with ties, and without
    for gold in golds + golds:  # twice: the second time the gold's side comes from the kept ones
        x = np.stack([np.round(gold + rng.standard_normal(n), 1) for _ in range(3)])  # the seeds tie too
        draws = rng.integers(0, n, size=(7, n))
        counts = np.stack([np.bincount(d, minlength=n) for d in draws]).astype(float)
        got = seed_statistic(x, gold, "spearman")(counts)  # (3, 7)

        def ranks(v):  # (7, n): each item's rank within each resample (undrawn items: any value, weight 0)
            out = np.zeros((len(draws), n))
            for b, d in enumerate(draws):
                out[b, d] = rankdata(v[d])
            return out

        want = np.stack([_weighted_pearson(ranks(p), ranks(gold), counts) for p in x])
        np.testing.assert_array_equal(got, want)
