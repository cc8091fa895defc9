"""IR metrics from one top-k pass: the exact top-k lowest-energy documents per query (`topk_ranking`), sliced
per k into trec_eval's metrics (`ir_metrics_per_query`). Energies: lower = better.

Definitions (trec_eval's, checked against pytrec_eval in the tests; relevance = grade > 0):
- nDCG@k (ndcg_cut_k): sum_{r <= k} grade(d_r) / log2(r + 1), divided by the same sum over the ideal
  ranking of all judged grades (grades <= 0 count as gain 0: a negative grade is non-relevant);
- MRR@k (recip_rank of the top k): 1 / rank of the first relevant doc within the top k, else 0;
- Recall@k (recall_k): |relevant in top k| / |relevant|;
- MAP@k (map_cut_k): sum over relevant docs at rank r <= k of precision@r, divided by |relevant|.
Every query that has judgements is scored, and one whose judgements are all grade <= 0 scores 0 on
every metric and counts in the mean, as trec_eval counts it. Ties in energy are broken as trec_eval
breaks ties in score: by document id, in decreasing (byte) order (`trec_tie_order`).
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import torch

EnergySource = Union[torch.Tensor, Iterable[torch.Tensor], Callable[[int, int], torch.Tensor]]


def trec_tie_order(doc_ids: Sequence[str]) -> np.ndarray:
    """(N,) position of each document among equal energies: trec_eval orders tied scores by document id,
    decreasing (strcmp on the bytes; Python's str order is the same for UTF-8)."""
    order = sorted(range(len(doc_ids)), key=lambda i: doc_ids[i], reverse=True)
    tie = np.empty(len(doc_ids), dtype=np.int64)
    tie[order] = np.arange(len(doc_ids))
    return tie


def _break_ties(chunk: torch.Tensor, val: torch.Tensor, idx: torch.Tensor, tie_order: np.ndarray):
    """Re-rank rows whose top k holds equal energies (or cuts through them) by tie_order. val, idx (c, k) on
    the CPU; chunk (c, N) where it was computed (a GPU: only the tied rows' candidates come to the CPU)."""
    kk = val.shape[1]
    if kk == 0:
        return val, idx
    candidates = chunk <= val[:, -1:].to(chunk.device)  # (c, N): everything tied with or better than the k-th
    tied = (candidates.sum(1).cpu() > kk) | (val[:, 1:] == val[:, :-1]).any(1)
    if not bool(tied.any()):
        return val, idx
    val, idx = val.clone(), idx.clone()
    for r in torch.nonzero(tied).flatten().tolist():
        cand = torch.nonzero(candidates[r]).flatten().cpu().numpy()
        e = chunk[r, torch.as_tensor(cand, device=chunk.device)].cpu().numpy()
        best = np.lexsort((tie_order[cand], e))[:kk]
        idx[r] = torch.as_tensor(cand[best])
        val[r] = torch.as_tensor(e[best])
    return val, idx


def topk_ranking(energies: EnergySource, k: int = 100, *, n_queries: Optional[int] = None,
                 chunk_size: int = 1024, exclude: Optional[Sequence[Sequence[int]]] = None,
                 return_energies: bool = False, tie_order: Optional[np.ndarray] = None):
    """Exact top-k lowest-energy docs per query, chunked over queries to bound memory.

    energies: a (Q, N) tensor; an iterable of (q_chunk, N) tensors in query order; or a callable
      fn(start, stop) -> (stop - start, N) energies (then give n_queries).
    exclude: optional per-query lists of doc indices never to return (e.g. the query itself).
    tie_order: optional (N,) rank of each doc among equal energies (`trec_tie_order(doc_ids)` ranks
      as trec_eval does); without it ties come out in torch.topk's order.
    Returns indices (Q, min(k, N)) int64, best first; with return_energies also their energies."""
    if isinstance(energies, torch.Tensor):
        if energies.dim() != 2:
            raise ValueError(f"topk_ranking: energies must be (Q, N); got {tuple(energies.shape)}")
        chunks = (energies[s:s + chunk_size] for s in range(0, energies.shape[0], chunk_size))
    elif callable(energies):
        if n_queries is None:
            raise ValueError("topk_ranking: a callable energy source needs n_queries")
        chunks = (energies(s, min(s + chunk_size, n_queries)) for s in range(0, n_queries, chunk_size))
    else:
        chunks = iter(energies)
    all_idx, all_val, start = [], [], 0
    for chunk in chunks:
        chunk = chunk.detach()
        if exclude is not None:
            chunk = chunk.clone()
            for r in range(chunk.shape[0]):
                drop = list(exclude[start + r])
                if drop:
                    chunk[r, drop] = float("inf")
        kk = min(k, chunk.shape[1])
        val, idx = torch.topk(chunk, kk, dim=1, largest=False, sorted=True)
        if tie_order is not None:
            val, idx = _break_ties(chunk, val.cpu(), idx.cpu(), tie_order)
        all_idx.append(idx.cpu())
        all_val.append(val.cpu())
        start += chunk.shape[0]
    if n_queries is not None and start != n_queries:
        raise ValueError(f"topk_ranking: energy source gave {start} queries, expected {n_queries}")
    indices = torch.cat(all_idx) if all_idx else torch.zeros(0, 0, dtype=torch.long)
    return (indices, torch.cat(all_val)) if return_energies else indices


def _ranked_lists(ranked, query_ids, doc_ids) -> dict[str, list[str]]:
    if isinstance(ranked, Mapping):
        return {str(q): [str(d) for d in docs] for q, docs in ranked.items()}
    if query_ids is None:
        raise ValueError("ir_metrics_per_query: give query_ids (one per ranked row) or ranked as "
                         "{qid: [docid, ...]}")
    if isinstance(ranked, torch.Tensor):
        ranked = ranked.cpu().numpy()
    if isinstance(ranked, np.ndarray) and np.issubdtype(ranked.dtype, np.integer):
        if doc_ids is None:
            raise ValueError("ir_metrics_per_query: integer rankings need doc_ids to map indices to document ids")
        doc_ids = np.asarray(doc_ids)
        ranked = [[str(d) for d in doc_ids[row]] for row in ranked]
    if len(ranked) != len(query_ids):
        raise ValueError(f"ir_metrics_per_query: {len(ranked)} ranked rows but {len(query_ids)} query ids")
    return {str(q): [str(d) for d in row] for q, row in zip(query_ids, ranked)}


def ndcg_and_ap(gains: np.ndarray, ideal: np.ndarray, n_rel: np.ndarray, ks: Sequence[int] = (10,),
                ap_depth: Optional[int] = None) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Per ranked list: nDCG@k for each k in ks, and average precision over the first ap_depth ranks (all
    when None); the maths of the IR metrics (graded gains) and of the labelled-text retrieval view (binary).

    gains (n, m): the gain of each ranked item, best first (> 0: relevant; binary gains may be bool);
    ideal (n, g): the gains of every relevant item, ranked or not, in decreasing order (0-padded; only the
    first max(ks) count); n_rel (n,): how many items are relevant (AP's denominator: a relevant item the
    list misses counts as a miss). A list with n_rel = 0 gets NaN."""
    discounts = 1.0 / np.log2(np.arange(2, gains.shape[1] + 2))  # (m,) 1 / log2(rank + 1)
    ideal_disc = 1.0 / np.log2(np.arange(2, ideal.shape[1] + 2))  # (g,)
    hits = gains[:, :ap_depth] > 0  # (n, depth)
    precision = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)  # precision@r at every rank r
    with np.errstate(invalid="ignore", divide="ignore"):  # n_rel = 0: 0 / 0
        ndcg = {k: (gains[:, :k] * discounts[:k]).sum(1) / (ideal[:, :k] * ideal_disc[:k]).sum(1) for k in ks}
        return ndcg, (precision * hits).sum(1) / n_rel


def ir_metrics_per_query(ranked, qrels: Mapping[str, Mapping[str, int]], ks: Sequence[int] = (1, 10, 100), *,
                         query_ids: Optional[Sequence[str]] = None, doc_ids=None):
    """Per-query metric values: (scored query ids, {metric: array (n_scored,)}).

    ranked: {qid: [docid, ...]} best first; or rows aligned with query_ids, either lists of doc ids or
    an integer (Q, k) index array / tensor into doc_ids (e.g. from topk_ranking).
    Metrics: ndcg@k, mrr@k, recall@k for k in ks (plus ndcg@10 / mrr@10 always) and map@max(ks).
    Scored: every ranked query with judgements in qrels (all-non-relevant ones score 0, as in trec_eval)."""
    lists = _ranked_lists(ranked, query_ids, doc_ids)
    cut_ks = sorted(set(ks) | {10})
    map_k = max(ks)
    names = [f"{m}@{k}" for m in ("ndcg", "mrr", "recall") for k in cut_ks] + [f"map@{map_k}"]
    values = {n: [] for n in names}
    scored = []
    for qid, docs in lists.items():
        if qid not in qrels or not qrels[qid]:
            continue  # trec_eval scores only the queries that have judgements
        judged = {str(d): int(g) for d, g in qrels[qid].items()}
        n_rel = sum(g > 0 for g in judged.values())
        if len(set(docs)) != len(docs):
            raise ValueError(f"ir_metrics_per_query: query {qid} ranks a document twice")
        scored.append(qid)
        if n_rel == 0:  # judged, nothing relevant: 0 on every metric, and it counts (trec_eval)
            for n in names:
                values[n].append(0.0)
            continue
        grades = np.array([max(judged.get(d, 0), 0) for d in docs], dtype=np.float64)  # (k_run,)
        rel = grades > 0
        ideal = np.sort(np.array([g for g in judged.values() if g > 0], dtype=np.float64))[::-1]
        # one list at a time: 0-padding lists of unequal length into one matrix would change numpy's
        # (pairwise) summation order, and so the last bits of the sums
        ndcg, ap = ndcg_and_ap(grades[None], ideal[None], np.array([n_rel]), cut_ks, ap_depth=map_k)
        first = int(np.argmax(rel)) + 1 if rel.any() else None  # 1-based rank of first relevant
        for k in cut_ks:
            values[f"ndcg@{k}"].append(float(ndcg[k][0]))
            values[f"mrr@{k}"].append(1.0 / first if first is not None and first <= k else 0.0)
            values[f"recall@{k}"].append(float(rel[:k].sum()) / n_rel)
        values[f"map@{map_k}"].append(float(ap[0]))
    if not scored:
        raise ValueError("ir_metrics_per_query: no ranked query has judgements in qrels (check query ids)")
    return scored, {n: np.asarray(v) for n, v in values.items()}
