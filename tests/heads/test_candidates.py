"""Corpus scale (heads.network.candidates): candidate mining and candidate selection equal the exact search when
the candidates are the whole corpus, the top-10 share against a loop, chunked test ranking = unchunked."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headstore.heads.network.candidates import frozen_topk
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.scoring.energy import ENERGIES
from headstore.heads.kinds import kind_of
from headstore.heads.kinds import ranking
from headstore.heads.evaluation.mining import mine_negatives
from headstore.heads.network.model import StackedMLP
from headstore.heads.training.train import train_stack

from .synthetic import planted_ir_task


def _head(dim: int, n: int = 2) -> StackedMLP:
    return StackedMLP(n, HeadConfig(depth=1, hidden=16, in_dim=dim), seeds=list(range(n)))


@pytest.mark.parametrize("pool_floats", [1 << 25, 1])  # one block of anchors; one anchor per block
def test_pool_of_the_whole_corpus_mines_as_exact(monkeypatch, pool_floats):
    from headstore.heads.network import candidates
    monkeypatch.setattr(candidates, "POOL_FLOATS", pool_floats)
    task, X = planted_ir_task(n_docs=150, dim=8)
    model = _head(8)
    corpus = np.unique(task.corpus_rows)
    anchors = task.train.anchor
    pool = frozen_topk(X, np.unique(anchors), corpus, len(corpus))  # every document
    embed = lambda rows, role="query": model.encode(X[torch.as_tensor(rows)], role).detach()  # noqa: E731
    for kw in ({}, {"embed": embed, "n_heads": 2, "energy": "l1"}):
        exact = mine_negatives(X, anchors, task.corpus_rows, task.relevant, 5, **kw)
        pooled = mine_negatives(X, anchors, task.corpus_rows, task.relevant, 5, pool=pool, **kw)
        assert torch.equal(exact, pooled)


@pytest.mark.parametrize("pool_floats", [1 << 25, 3000, 1])
def test_pool_energies_ask_each_document_once_and_equal_the_exact_search(monkeypatch, pool_floats):
    """Overlapping pools: every pooled document's outputs asked for once give each entry the energy of the exact
    search (pairwise_energy over all documents: l1 bit for bit, l2 and cosine within rounding) and of a loop."""
    from headstore.heads.network import candidates
    from headstore.heads.scoring.energy import pairwise_energy
    monkeypatch.setattr(candidates, "POOL_FLOATS", pool_floats)
    rng = np.random.default_rng(0)
    H, U, c, dim, n = 3, 40, 12, 24, 60  # 40 pools of 12 among 60 documents: most documents in several pools
    Z, za = torch.randn(H, n, dim), torch.randn(H, U, dim)
    pool = np.sort(np.stack([rng.choice(n, c, replace=False) for _ in range(U)]), axis=1)
    asked = []
    def zd_of(docs):
        asked.extend(docs.tolist())
        return Z[:, torch.as_tensor(docs)]
    rows = torch.arange(U)[:, None]
    for energy in ENERGIES:
        asked.clear()
        E = candidates._pool_energies(za, zd_of, pool, energy)
        assert sorted(asked) == sorted(set(pool.flatten().tolist()))  # each pooled document once
        loop = torch.stack([torch.stack([ENERGIES[energy](za[h, u], Z[h, pool[u, j]]) for u in range(U)
                                         for j in range(c)]).view(U, c) for h in range(H)])
        torch.testing.assert_close(E, loop, rtol=1e-5, atol=1e-5)
        exact = pairwise_energy(energy, za, Z)[:, rows, torch.as_tensor(pool)]  # (H, U, c) from the (H, U, n) search
        if energy == "l1":
            assert torch.equal(E, exact)
        else:
            torch.testing.assert_close(E, exact, rtol=1e-5, atol=1e-5)
    exclude = [[int(pool[u, 0])] for u in range(U)]  # each anchor's first candidate is its positive
    mined = candidates.pooled_negatives(za, zd_of, pool, 3, exclude, "l1")
    exact = pairwise_energy("l1", za, Z)[:, rows, torch.as_tensor(pool)]
    exact[:, :, 0] = float("inf")
    want = torch.as_tensor(pool)[rows, torch.topk(exact, 3, dim=-1, largest=False).indices]
    assert torch.equal(mined, want)
    assert mined.shape == (H, U, 3) and not (mined == torch.as_tensor(pool[:, :1])).any()


def test_pool_is_the_exact_frozen_top_k(monkeypatch):
    rng = np.random.default_rng(0)
    X = torch.tensor(rng.normal(size=(3000, 16)), dtype=torch.float32)
    corpus, queries = np.arange(2000), np.arange(2000, 2100)
    pool = frozen_topk(X, queries, corpus, 50)
    assert pool.shape == (100, 50) and (np.diff(pool, axis=1) > 0).all() and pool.min() >= 0
    cos = torch.nn.functional.normalize(X[2000:2100], dim=1) @ torch.nn.functional.normalize(X[:2000], dim=1).T
    want = np.sort(torch.topk(cos, 50, dim=1).indices.numpy(), axis=1)  # one matmul over the whole corpus
    assert np.array_equal(pool, want)
    from headstore.heads.network import candidates
    monkeypatch.setattr(candidates, "DOC_BLOCK", 128)  # 16 blocks merged
    monkeypatch.setattr(candidates, "QUERY_CHUNK", 7)
    assert np.array_equal(frozen_topk(X, queries, corpus, 50), want)


def test_candidate_training_equals_exact_when_candidates_are_the_corpus():
    task, X = planted_ir_task(n_docs=150, dim=8)
    head = HeadConfig(depth=1, hidden=16, in_dim=8)
    base = TrainConfig(epochs=3, batch_size=16, mined_k=4, patience=5)
    _, _, exact = train_stack(task, X, head, [base], progress=False)
    _, _, cand = train_stack(task, X, head, [base.replace(exact_max=0, pool_k=1000)], progress=False)
    assert exact[0].history == cand[0].history
    assert cand[0].negatives["method"] == "candidates" and exact[0].negatives["method"] == "exact"
    assert cand[0].dev_candidates["method"] == "candidates" and cand[0].dev_candidates["n_candidates"] == 150


def test_selection_on_the_whole_corpus_as_candidates_is_exact():
    task, X = planted_ir_task(n_docs=150, dim=8)
    kind = kind_of(task)
    chosen, report = kind.selection_set(task, "dev", X, TrainConfig(exact_max=0, pool_k=1000).negatives)
    assert chosen.doc_ids == task.eval_sets["dev"].doc_ids and report["method"] == "candidates"
    model = _head(8)
    embed = lambda rows, role="query": model.encode(X[torch.as_tensor(rows)], role).detach()  # noqa: E731
    full = kind.selection_scores(task, "dev", embed, "l1", "fp32")
    cut = kind.selection_scores(task.__class__(**{**task.__dict__, "eval_sets": {"dev": chosen}}), "dev", embed,
                                "l1", "fp32")
    assert full == cut


def test_top10_share_against_a_loop():
    task, X = planted_ir_task(n_docs=150, dim=8)
    kind = kind_of(task)
    chosen, _ = kind.selection_set(task, "dev", X, TrainConfig(exact_max=0, pool_k=10).negatives)
    model = _head(8, n=1)
    embed = lambda rows, role="query": model.encode(X[torch.as_tensor(rows)], role).detach()  # noqa: E731
    rankings = {}
    kind.evaluate_splits(task, ("dev",), embed, ("l1", "cosine"), rankings)  # the first energy's ranking is used
    got = kind.candidate_share(task, "dev", chosen, rankings)
    dev = task.eval_sets["dev"]
    inside, hits, total = set(chosen.doc_ids), 0, 0
    for q in dev.query_rows:  # every query (n >= the split), its 10 lowest L1 energies by a loop
        zq = embed(np.array([q]))[0, 0]
        e = [(ENERGIES["l1"](zq, embed(np.array([d]))[0, 0]).item(), j) for j, d in enumerate(dev.doc_rows)]
        for _, j in sorted(e, key=lambda t: t[0])[:10]:
            hits += dev.doc_ids[j] in inside
            total += 1
    assert got["share_queries"] == len(dev.query_ids)
    assert abs(got["top10_share"] - hits / total) < 1e-12
    assert 0 < got["top10_share"] < 1


def test_splits_of_one_corpus_ranked_in_one_pass_equal_each_alone(monkeypatch):
    task, X = planted_ir_task(n_docs=150, dim=8)
    kind, model = kind_of(task), _head(8, n=2)
    embed = lambda rows, role="query": model.encode(X[torch.as_tensor(rows)], role).detach()  # noqa: E731
    monkeypatch.setattr(ranking, "DOC_BLOCK", 40)  # 4 blocks of the corpus
    from headstore.heads.kinds import ir
    monkeypatch.setattr(ir, "doc_blocks", ranking.doc_blocks)
    passes = []
    counting = lambda rows, role="query": passes.append(role) or embed(rows, role)  # noqa: E731
    together = kind.evaluate_splits(task, ("dev", "test"), counting, ("l1", "cosine"))
    assert passes.count("document") == 4  # one pass over the corpus for both splits
    for split in ("dev", "test"):
        alone = kind.evaluate(task, split, embed, ("l1", "cosine"))
        assert together[split][0] == alone[0]
        assert all(np.array_equal(a[p], b[p]) for a, b in zip(together[split][1], alone[1]) for p in a)


def test_chunked_test_ranking_equals_unchunked(monkeypatch):
    task, X = planted_ir_task(n_docs=150, dim=8)
    split = task.eval_sets["test"]
    q, d = X[torch.as_tensor(split.query_rows)], X[torch.as_tensor(split.doc_rows)]
    whole = ranking.evaluate_ir(split, q, d, "l1")
    monkeypatch.setattr(ranking, "RANK_BLOCK", 150 * 3)  # 3 queries per pass
    chunked = ranking.evaluate_ir(split, q, d, "l1")
    assert whole[0] == chunked[0] and np.array_equal(whole[1], chunked[1])


@pytest.mark.parametrize("energy", ["l1", "cosine"])
def test_corpus_ranked_block_by_block_equals_one_pass_ties_included(monkeypatch, energy):
    from headstore.heads.kinds import kind_of
    from headstore.heads.evaluation.evaluate import embedder

    task, X = planted_ir_task(n_docs=150, dim=8)
    split = task.eval_sets["test"]
    X = X.clone()
    X[torch.as_tensor(split.doc_rows[100:140])] = X[torch.as_tensor(split.doc_rows[:40])]  # 40 exact ties across blocks
    q, d = X[torch.as_tensor(split.query_rows)], X[torch.as_tensor(split.doc_rows)]
    whole = ranking.rank_split(split, q, d, energy, with_energies=True)
    whole_metrics = kind_of(task).evaluate(task, "test", embedder(None, X), (energy,))
    monkeypatch.setattr(ranking, "DOC_BLOCK", 16)  # 10 blocks: ties fall in different blocks
    blocked = ranking.rank_split(split, q, d, energy, with_energies=True)
    assert blocked[0] == whole[0]
    if energy == "l1":  # cdist: each energy on its own, whatever the block
        assert blocked[1] == whole[1]
    else:  # a matmul over fewer documents may round the last bit otherwise
        for qid in whole[1]:
            np.testing.assert_allclose(blocked[1][qid], whole[1][qid], rtol=0, atol=1e-6)
    # the same documents, ranked as a loop over sorted (energy, trec tie order) pairs would rank them
    tie = ranking.trec_tie_order(split.doc_ids)
    E = ranking.pairwise_energy(energy, q, d)
    for i, qid in enumerate(split.query_ids[:10]):
        want = sorted(range(len(split.doc_ids)), key=lambda j: (float(E[i, j]), tie[j]))[:100]
        assert blocked[0][qid] == want
    got = kind_of(task).evaluate(task, "test", embedder(None, X), (energy,))
    assert got[0] == whole_metrics[0] and all(np.array_equal(got[1][0][p], whole_metrics[1][0][p]) for p in got[1][0])


@pytest.mark.parametrize("safe", [1e-4, 10.0])  # 10: every query takes the whole-block fallback
def test_faiss_proposed_l1_ranking_equals_torch_ranking(monkeypatch, safe):
    pytest.importorskip("faiss")
    task, X = planted_ir_task(n_docs=400, dim=8)
    split = task.eval_sets["test"]
    X = X.clone()
    X[torch.as_tensor(split.doc_rows[300:380])] = X[torch.as_tensor(split.doc_rows[:80])]  # exact ties
    q, d = X[torch.as_tensor(split.query_rows)], X[torch.as_tensor(split.doc_rows)]
    monkeypatch.setattr(ranking, "DOC_BLOCK", 128)
    slow = ranking.RunningTopK(q, "l1", 30, ranking.trec_tie_order(split.doc_ids), fast_l1=False)
    fast = ranking.RunningTopK(q, "l1", 30, ranking.trec_tie_order(split.doc_ids))  # 400 documents > DOC_BLOCK
    monkeypatch.setattr(ranking, "L1_MARGIN", 8)
    monkeypatch.setattr(ranking, "L1_SAFE", safe)
    for start, block in ranking.doc_blocks(d, len(split.doc_ids)):
        slow.add(block, start)
        fast.add(block, start)
    assert torch.equal(fast.idx, slow.idx) and torch.equal(fast.val, slow.val)
