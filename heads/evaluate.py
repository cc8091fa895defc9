"""Evaluators: a split of a task + embeddings -> `dict[str, float]` with sentence-transformers/MTEB names.

Names are prefixed by the similarity used: `manhattan` (L1 energy), `euclidean` (L2), `cosine`:
`manhattan_ndcg@10`, `cosine_mrr@10`, `spearman_manhattan`, `manhattan_auc`, ... Every evaluator works
on a stack of H heads at once and returns one dict per head. The frozen baseline is the same evaluator
run on the raw stored features (a stack of one "identity head") with cosine and with L1.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from headstore.heads.energy import ENERGIES, pairwise_energy
from headstore.heads.metrics import ir_metrics_per_query, pair_metrics, sts_metrics, topk_ranking, trec_tie_order
from headstore.heads.model import autocast
from headstore.heads.tasks import IRSplit, PairSet, Task

PREFIX = {"l1": "manhattan", "l2": "euclidean", "cosine": "cosine"}
IR_TOPK = 100  # one top-k pass serves every cutoff (1, 10, 100)
EMBED_BATCH = 8192  # rows per forward pass when embedding a split; bounds memory, not results
# epoch selection on an IR split with L1 energy: each query's exact L1 energies are computed for its
# SELECT_CANDIDATES nearest documents by L2 (one batched matmul for all heads) instead of all documents
# (torch.cdist p=1 has no matmul form and dominated SciFact grids); the exact L1 top 10 was inside the
# candidates for every query, head and epoch measured (bench/grid.py reports the recall)
SELECT_CANDIDATES = 100
SELECT_BLOCK = 1 << 25  # energy entries (heads x queries x documents) per block of the selection pass

Embed = Callable[[np.ndarray], torch.Tensor]  # store rows (n,) -> (H, n, d)


def primary_metric(task_kind: str, energy: str) -> str:
    """The name of the metric heads are selected on."""
    p = PREFIX[energy]
    return {"ir": f"{p}_ndcg@10", "sts": f"spearman_{p}", "pairs": f"{p}_auc", "labels": f"{p}_knn_accuracy"}[task_kind]


def embed_rows(model: torch.nn.Module | None, features: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Head outputs of store rows, (H, n, d); `model=None` is the frozen baseline, (1, n, D)."""
    idx = torch.as_tensor(np.asarray(rows), dtype=torch.long)
    if model is None:
        return features[idx].unsqueeze(0)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(features[idx[s:s + EMBED_BATCH]]) for s in range(0, len(idx), EMBED_BATCH)], dim=1)
    model.train(was_training)
    return out


def _ranked_ids(split: IRSplit, ranked: torch.Tensor, k: int) -> dict[str, list[str]]:
    """Index rows -> {query id: [doc id, ...]} (at most k), dropping a query's own text where asked."""
    out = {}
    for qid, row in zip(split.query_ids, ranked.tolist()):
        docs = [split.doc_ids[j] for j in row]
        if split.exclude_self and qid not in split.qrels.get(qid, {}):
            docs = [d for d in docs if d != qid]
        out[qid] = docs[:k]
    return out


def _ir(split: IRSplit, q: torch.Tensor, d: torch.Tensor, energy: str) -> tuple[dict, dict]:
    """q (Q, dim), d (N, dim) of one head -> (metrics, per-query primary values).

    Ties in energy are broken as trec_eval breaks tied scores (by document id, decreasing)."""
    k = IR_TOPK + int(split.exclude_self)  # one spare: a query's own text is dropped from its list
    ranked = topk_ranking(lambda s, e: pairwise_energy(energy, q[s:e], d), k=k, n_queries=q.shape[0],
                          chunk_size=256, tie_order=trec_tie_order(split.doc_ids))
    _, per_query = ir_metrics_per_query(_ranked_ids(split, ranked, IR_TOPK), split.qrels, (1, 10, 100))
    p = PREFIX[energy]
    return {f"{p}_{m}": float(v.mean()) for m, v in per_query.items()}, {"ndcg@10": per_query["ndcg@10"]}


def _nan_metrics(task: Task, data, energies: tuple[str, ...]) -> tuple[dict, dict]:
    """Every metric NaN: a head whose outputs are not finite has no ranking worth scoring."""
    m, it = {}, {}
    for energy in energies:
        p = PREFIX[energy]
        names = ([f"{p}_{n}@{k}" for n in ("ndcg", "mrr", "recall") for k in (1, 10, 100)] + [f"{p}_map@100"]
                 if task.kind == "ir" else
                 [f"spearman_{p}", f"pearson_{p}"] if task.kind == "sts" else
                 [f"{p}_{n}" for n in ("auc", "accuracy", "accuracy_threshold", "f1", "f1_threshold", "ap")])
        m.update({n: float("nan") for n in names})
        n_items = len(data.query_ids) if task.kind == "ir" else len(data)
        it[p] = np.full(n_items, np.nan)
    return m, it


def _pairs(ps: PairSet, a: torch.Tensor, b: torch.Tensor, energy: str, kind: str) -> tuple[dict, dict]:
    e = ENERGIES[energy](a, b).double().numpy()  # (P,)
    p = PREFIX[energy]
    if kind == "sts":
        m = sts_metrics(-e, ps.labels)
        return {f"spearman_{p}": m["spearman"], f"pearson_{p}": m["pearson"]}, {"pred": -e}
    labels = np.asarray(ps.labels) > 0.5
    m = pair_metrics(e, labels.astype(int))
    out = {f"{p}_{k}": v for k, v in m.items()}
    from sklearn.metrics import average_precision_score

    out[f"{p}_ap"] = float(average_precision_score(labels, -e))
    return out, {"pred": -e}


def evaluate_split(task: Task, split: str, embed: Embed, energies: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """Metrics of every head on one split, for each energy in `energies`.

    Returns (metrics per head, per-item values per head for bootstrap CIs)."""
    if task.kind == "labels":  # labelled texts: probe, k-NN, retrieval view (heads.label_eval)
        from headstore.heads.label_eval import evaluate_labels

        return evaluate_labels(task, split, embed, energies)
    data = task.eval_sets[split]
    results: list[dict] = []
    items: list[dict] = []
    if task.kind == "ir":
        zq, zd = embed(data.query_rows), embed(data.doc_rows)  # (H, Q, d), (H, N, d)
        for h in range(zq.shape[0]):
            if not (torch.isfinite(zq[h]).all() and torch.isfinite(zd[h]).all()):
                m, it = _nan_metrics(task, data, energies)
                results.append(m)
                items.append(it)
                continue
            m, it = {}, {}
            for energy in energies:
                mh, ih = _ir(data, zq[h], zd[h], energy)
                m.update(mh)
                it[PREFIX[energy]] = ih["ndcg@10"]
            results.append(m)
            items.append(it)
    else:
        za, zb = embed(data.anchor), embed(data.positive)
        for h in range(za.shape[0]):
            if not (torch.isfinite(za[h]).all() and torch.isfinite(zb[h]).all()):
                m, it = _nan_metrics(task, data, energies)
                results.append(m)
                items.append(it)
                continue
            m, it = {}, {}
            for energy in energies:
                mh, ih = _pairs(data, za[h], zb[h], energy, task.kind)
                m.update(mh)
                it[PREFIX[energy]] = ih["pred"]
            results.append(m)
            items.append(it)
    return results, items


def baseline_metrics(task: Task, split: str, features: torch.Tensor) -> dict[str, float]:
    """The frozen baseline: raw stored features, cosine and L1, no head."""
    results, _ = evaluate_split(task, split, lambda rows: embed_rows(None, features, rows), ("cosine", "l1"))
    return results[0]


# ------------------------------------------------------------------ epoch selection: one pass, all heads


def l1_on_candidates(q: torch.Tensor, d: torch.Tensor, n_candidates: int, precision: str = "fp32") -> torch.Tensor:
    """(H, Q, N) L1 energies: exact (fp32 torch.cdist) on each query's `n_candidates` nearest documents by
    L2 distance, +inf elsewhere. q (H, Q, dim), d (H, N, dim); the L2 proxy is one batched matmul, in bf16
    under precision "bf16" (it only picks candidates; the energies kept are exact)."""
    H, Q, dim = q.shape
    with autocast(precision, q.device):
        dots = torch.bmm(q, d.transpose(1, 2)).float()  # (H, Q, N)
    proxy = d.pow(2).sum(-1).unsqueeze(1) - 2 * dots  # ||q - d||^2 - ||q||^2: the same order per query
    cand = proxy.topk(n_candidates, dim=-1, largest=False).indices  # (H, Q, c)
    docs = d[torch.arange(H, device=d.device)[:, None, None], cand]  # (H, Q, c, dim)
    exact = torch.cdist(q.reshape(H * Q, 1, dim), docs.reshape(H * Q, n_candidates, dim), p=1.0)  # (HQ, 1, c)
    out = torch.full((H, Q, d.shape[1]), float("inf"), device=q.device)
    return out.scatter_(2, cand, exact.view(H, Q, n_candidates))


def _head_energies(energy: str, q: torch.Tensor, d: torch.Tensor, k: int, precision: str) -> torch.Tensor:
    """(H, Q, N) energies of a block of heads whose top k is exact (see l1_on_candidates)."""
    n_candidates = max(SELECT_CANDIDATES, k)
    if energy == "l1" and d.shape[1] > n_candidates:
        return l1_on_candidates(q, d, n_candidates, precision)
    return pairwise_energy(energy, q, d)  # cosine and l2: matmul-based already, exact fp32


def selection_scores(task: Task, split: str, embed: Embed, energy: str, precision: str = "fp32") -> list[float]:
    """The primary metric of every head on `split`: what training selects epochs on, once per epoch.

    IR splits are scored for all heads in one pass (energies of a block of heads in one batched call,
    L1 on candidates: `l1_on_candidates`), with the ranking rules of `evaluate_split` (trec_eval ties,
    a query's own text dropped); other tasks go through `evaluate_split`. A head whose outputs are not
    finite scores NaN."""
    metric = primary_metric(task.kind, energy)
    if task.kind != "ir":
        results, _ = evaluate_split(task, split, embed, (energy,))
        return [r[metric] for r in results]
    data = task.eval_sets[split]
    zq, zd = embed(data.query_rows).float(), embed(data.doc_rows).float()  # (H, Q, d), (H, N, d)
    H, Q, N = zq.shape[0], zq.shape[1], zd.shape[1]
    k = 10 + int(data.exclude_self)  # nDCG@10, one spare for a query's own text
    tie = trec_tie_order(data.doc_ids)
    block = max(1, SELECT_BLOCK // max(1, Q * N, Q * max(SELECT_CANDIDATES, k) * zq.shape[2]))
    scores: list[float] = []
    for h0 in range(0, H, block):
        q, d = zq[h0:h0 + block], zd[h0:h0 + block]
        finite = torch.isfinite(q).flatten(1).all(1) & torch.isfinite(d).flatten(1).all(1)
        E = _head_energies(energy, q.nan_to_num(0.0, 0.0, 0.0), d.nan_to_num(0.0, 0.0, 0.0), k, precision)
        for h in range(q.shape[0]):
            if not finite[h]:
                scores.append(float("nan"))
                continue
            ranked = topk_ranking(E[h], k=k, tie_order=tie)
            _, per_query = ir_metrics_per_query(_ranked_ids(data, ranked, 10), data.qrels, (10,))
            scores.append(float(per_query["ndcg@10"].mean()))
    return scores
