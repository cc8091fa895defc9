"""Every IR metric against trec_eval (pytrec_eval): on tied scores, all-zero-grade and negative-grade
queries, and on real BEIR qrels with a real (TF-IDF) run whose scores are rounded into ties."""
import numpy as np
import pytest
import torch

from headstore.data.dataset import load_dataset
from headstore.data.text_id import doc_text
from headstore.heads.scoring.ir_metrics import ir_metrics_per_query, topk_ranking, trec_tie_order

pytrec_eval = pytest.importorskip("pytrec_eval")

KS = (1, 10, 100)
MEASURES = {f"ndcg_cut.{','.join(map(str, KS))}", f"recall.{','.join(map(str, KS))}", "map_cut.100", "recip_rank"}


def ours_vs_trec_eval(scores: np.ndarray, query_ids, doc_ids, qrels):
    """Our metrics from a top-100 ranking of `scores` (Q, N), beside trec_eval's on the full run."""
    ranked = topk_ranking(torch.as_tensor(-scores), k=100, tie_order=trec_tie_order(doc_ids), chunk_size=7)
    scored, ours = ir_metrics_per_query(ranked, qrels, KS, query_ids=query_ids, doc_ids=doc_ids)
    run = {q: {d: float(s) for d, s in zip(doc_ids, row)} for q, row in zip(query_ids, scores)}
    theirs = pytrec_eval.RelevanceEvaluator({q: qrels[q] for q in scored}, MEASURES).evaluate(run)
    return scored, ours, theirs


def assert_same(scored, ours, theirs):
    assert sorted(theirs) == sorted(scored)  # the same queries are scored (all-zero ones included)
    for i, q in enumerate(scored):
        t = theirs[q]
        for k in KS:
            assert ours[f"ndcg@{k}"][i] == pytest.approx(t[f"ndcg_cut_{k}"], abs=1e-9), (q, k)
            assert ours[f"recall@{k}"][i] == pytest.approx(t[f"recall_{k}"], abs=1e-9), (q, k)
            rr = t["recip_rank"]  # of the full run: MRR@k is it when the first relevant doc is within k
            assert ours[f"mrr@{k}"][i] == pytest.approx(rr if rr >= 1 / k - 1e-12 else 0.0, abs=1e-9), (q, k)
        assert ours["map@100"][i] == pytest.approx(t["map_cut_100"], abs=1e-9), q
    means = {m: np.mean([theirs[q][m] for q in scored]) for m in ("ndcg_cut_10", "recall_100", "map_cut_100")}
    assert ours["ndcg@10"].mean() == pytest.approx(means["ndcg_cut_10"], abs=1e-9)
    assert ours["recall@100"].mean() == pytest.approx(means["recall_100"], abs=1e-9)


def test_tied_scores_zero_and_negative_grades_match_trec_eval():
    rng = np.random.default_rng(0)
    Q, N = 30, 160
    doc_ids = [f"d{rng.integers(0, 10**6)}-{j}" for j in range(N)]  # tie order is not the index order
    query_ids = [f"q{i}" for i in range(Q)]
    scores = rng.integers(0, 6, size=(Q, N)).astype(np.float64)  # six score levels: ties everywhere
    scores[0] = 1.0  # a query whose scores are all tied
    qrels = {}
    for i, q in enumerate(query_ids):
        judged = rng.choice(N, size=12, replace=False)
        qrels[q] = {doc_ids[j]: int(g) for j, g in zip(judged, rng.choice([-1, 0, 0, 1, 2, 3], size=12))}
        qrels[q][doc_ids[judged[0]]] = 2
    qrels["q1"] = {doc_ids[j]: 0 for j in range(5)}  # judged, nothing relevant: trec_eval scores it 0
    qrels["q2"] = {doc_ids[3]: -1, doc_ids[4]: 1}  # a negative grade is non-relevant
    assert_same(*ours_vs_trec_eval(scores, query_ids, doc_ids, qrels))


def test_ties_cut_by_the_top_k_boundary_follow_trec_eval():
    """200 docs tied at one score: which 100 enter the ranking decides recall@100."""
    doc_ids = [f"doc{j:03d}" for j in range(200)]
    scores = np.ones((1, 200))
    qrels = {"q": {"doc000": 1, "doc199": 1, "doc150": 2}}
    scored, ours, theirs = ours_vs_trec_eval(scores, ["q"], doc_ids, qrels)
    assert_same(scored, ours, theirs)
    assert ours["recall@100"][0] == pytest.approx(2 / 3)  # doc199 and doc150 rank in the top 100 (ids decreasing)


def _tfidf_run(folder, split: str, max_queries: int = 60):
    from sklearn.feature_extraction.text import TfidfVectorizer

    ds = load_dataset(folder)
    corpus, queries = ds.frames["corpus"], ds.frames["queries"]
    qrels_frame = ds.qrels[split]
    qrels: dict[str, dict[str, int]] = {}
    for q, d, s in qrels_frame.iter_rows():
        qrels.setdefault(q, {})[d] = int(s)
    query_ids = sorted(qrels)[:max_queries]
    q_text = dict(zip(queries["_id"], queries["text"]))
    vec = TfidfVectorizer().fit([doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])])
    D = vec.transform([doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])])
    S = (vec.transform([q_text[q] for q in query_ids]) @ D.T).toarray()
    return np.round(S, 2), query_ids, corpus["_id"].to_list(), {q: qrels[q] for q in query_ids}


@pytest.mark.slow
@pytest.mark.parametrize("name, split", [("cranfield", "test"), ("cacm", "test")])
def test_real_qrels_and_a_real_run_match_trec_eval(real_dataset, name, split):
    scores, query_ids, doc_ids, qrels = _tfidf_run(real_dataset(name), split)
    scored, ours, theirs = ours_vs_trec_eval(scores, query_ids, doc_ids, qrels)
    assert len(scored) == len(query_ids)
    assert ours["ndcg@10"].mean() > 0.1  # a real run, not noise
    assert_same(scored, ours, theirs)
