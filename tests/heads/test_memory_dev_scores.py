"""The memory's dev scores over its strengths (heads.training.memory_fit.dev_scores): each strength's nDCG@10 is
trec_eval's (pytrec_eval) on an exact L1 ranking of the dev corpus with that strength's judged documents moved, and
no tensor the size of every strength's copy of the dev documents is ever made (on a 1M-document corpus's dev
candidates, 11 strengths, that stack and its ranking's blocks took the peak RSS 0.8 GB above the scale goal)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from headstore.heads.kinds.ranking import SELECT_CANDIDATES, IRSplit
from headstore.heads.training.memory_fit import dev_scores

pytrec_eval = pytest.importorskip("pytrec_eval")

N_DOCS, N_QUERIES, DIM, N_JUDGED = 300, 20, 16, 12  # more documents than SELECT_CANDIDATES: L1 on candidates


def _world():
    g = torch.Generator().manual_seed(7)
    features = torch.randn(N_QUERIES + N_DOCS, DIM, generator=g)
    q_rows, d_rows = np.arange(N_QUERIES), np.arange(N_QUERIES, N_QUERIES + N_DOCS)
    doc_ids = [f"d{j:03d}" for j in range(N_DOCS)]
    qrels = {f"q{i}": {doc_ids[(7 * i) % N_DOCS]: 1} for i in range(N_QUERIES)}
    dev = IRSplit([f"q{i}" for i in range(N_QUERIES)], q_rows, doc_ids, d_rows, qrels)
    docs = np.sort(np.random.default_rng(3).choice(d_rows, N_JUDGED, replace=False))  # the memory's documents
    judged = features[torch.as_tensor(docs)]
    # strength g: the judged documents moved a share of the way to the first dev query (so some strengths help)
    candidates = [judged + s * (features[0] - judged) for s in (0.0, 0.2, 0.5, 0.9, 1.0)]
    return SimpleNamespace(eval_sets={"dev": dev}), features, docs, candidates, dev


def _reference(features, docs, cand, dev) -> float:
    """pytrec_eval's nDCG@10 of the exact L1 ranking of every dev document, the judged ones replaced by `cand`."""
    d = features[torch.as_tensor(dev.doc_rows)].clone()
    d[torch.as_tensor(docs - N_QUERIES)] = cand
    energy = torch.cdist(features[torch.as_tensor(dev.query_rows)].double(), d.double(), p=1.0)
    run = {qid: {dev.doc_ids[j]: -float(energy[i, j]) for j in range(N_DOCS)} for i, qid in enumerate(dev.query_ids)}
    per_query = pytrec_eval.RelevanceEvaluator(dev.qrels, {"ndcg_cut.10"}).evaluate(run)
    return float(np.mean([v["ndcg_cut_10"] for v in per_query.values()]))


def test_each_strength_scores_trec_evals_ndcg_of_its_exact_ranking():
    task, features, docs, candidates, dev = _world()
    assert N_DOCS > SELECT_CANDIDATES
    got = dev_scores(task, features, None, None, "l1", docs, candidates, "outputs", None, "fp32")
    want = [_reference(features, docs, c, dev) for c in candidates]
    assert len(set(np.round(want, 6))) > 1  # the strengths differ, so a score in the wrong place is seen
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


class _Largest(TorchDispatchMode):
    """The largest number of elements of any tensor an op returns inside the block."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def test_no_tensor_holds_every_strengths_copy_of_the_dev_documents():
    task, features, docs, candidates, dev = _world()
    with _Largest() as seen:
        dev_scores(task, features, None, None, "l1", docs, candidates, "outputs", None, "fp32")
    one_strength = max(N_QUERIES * N_DOCS, N_DOCS * DIM, N_QUERIES * SELECT_CANDIDATES * DIM)  # one ranking's blocks
    assert seen.numel <= one_strength  # all strengths at once: (G, Q, candidates, d), 5x that
