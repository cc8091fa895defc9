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
from headstore.heads.metrics import ir_metrics_per_query, pair_metrics, sts_metrics, topk_ranking
from headstore.heads.tasks import IRSplit, PairSet, Task

PREFIX = {"l1": "manhattan", "l2": "euclidean", "cosine": "cosine"}
IR_TOPK = 100  # one top-k pass serves every cutoff (1, 10, 100)
EMBED_BATCH = 8192  # rows per forward pass when embedding a split; bounds memory, not results

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


def _ir(split: IRSplit, q: torch.Tensor, d: torch.Tensor, energy: str) -> tuple[dict, dict]:
    """q (Q, dim), d (N, dim) of one head -> (metrics, per-query primary values)."""
    ranked = topk_ranking(lambda s, e: pairwise_energy(energy, q[s:e], d), k=IR_TOPK, n_queries=q.shape[0],
                          chunk_size=256)
    _, per_query = ir_metrics_per_query(ranked, split.qrels, (1, 10, 100), query_ids=split.query_ids,
                                        doc_ids=split.doc_ids)
    p = PREFIX[energy]
    return {f"{p}_{m}": float(v.mean()) for m, v in per_query.items()}, {"ndcg@10": per_query["ndcg@10"]}


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
