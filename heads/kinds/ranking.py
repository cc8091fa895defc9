"""Ranking a corpus for the IR kind: evaluation, per-epoch selection, and TREC run files, one ranking rule.

Every query ranks every document of its split by energy; ties are broken as trec_eval breaks tied scores
(by document id, decreasing), and a query's own text is dropped from its list where the split says so
(pairs scored as retrieval: an anchor that is also another pair's positive would otherwise come first at
energy 0). The run files (`run.<split>.trec`) are written from the same ranking, so trec_eval on them
reproduces metrics.json:

    <query_id> Q0 <doc_id> <rank> <score> <run_name>

score = -energy, with 9 significant digits so float32 energies round-trip and distinct energies stay distinct.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from pathlib import Path

import numpy as np
import torch

from headstore.data.files import atomic_write_text
from headstore.heads.scoring.energy import candidate_energy, pairwise_energy
from headstore.heads.network.candidates import DOC_BLOCK, candidate_docs, frozen_topk  # DOC_BLOCK: documents embedded and
# ranked at a time, so a corpus is never one (N, d) matrix of head outputs
from headstore.heads.kinds.base import PREFIX
from headstore.heads.scoring.ir_metrics import ir_metrics_per_query, topk_ranking, trec_tie_order
from headstore.heads.network.model import autocast

IR_TOPK = 100  # one top-k pass serves every cutoff (1, 10, 100)
RANK_CHUNK = 256  # queries per top-k pass
RANK_BLOCK = 1 << 24  # energy entries (queries x documents) per top-k pass: 64 MB whatever the corpus size;
# fewer queries per pass on a large corpus (the ranking of a query does not depend on the others in its pass)
# epoch selection on an IR split with L1 energy: each query's exact L1 energies are computed for its
# SELECT_CANDIDATES nearest documents by L2 (one batched matmul for all heads) instead of all documents
# (torch.cdist p=1 has no matmul form and dominated SciFact grids); the exact L1 top 10 was inside the
# candidates for every query, head and epoch measured (bench/speed/grid.py reports the recall)
SELECT_CANDIDATES = 100
SELECT_BLOCK = 1 << 25  # energy entries (heads x queries x documents) per block of the selection pass


@dataclass(frozen=True)
class IRSplit:
    """One IR evaluation split: queries ranked against the whole corpus."""

    query_ids: list[str]
    query_rows: np.ndarray  # (Q,) int64
    doc_ids: list[str]
    doc_rows: np.ndarray  # (N,) int64
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> grade
    # pairs scored as retrieval: ids are text ids, and a query is not ranked against its own text
    exclude_self: bool = False
    # the texts by id, {"query": {id: text}, "document": {id: text}} (shared by the splits of one dataset), for
    # a lexical channel beside the dense scores (heads.scoring.lexical); None where the split was built without them
    texts: Optional[dict] = None


def ranked_ids(split: IRSplit, ranked: torch.Tensor, k: int) -> dict[str, list[int]]:
    """Index rows (Q, k') -> {query id: [document index, ...]} (at most k), dropping a query's own text
    where the split says so (unless it is one of its relevant documents)."""
    out = {}
    for qid, row in zip(split.query_ids, ranked.tolist()):
        if split.exclude_self and qid not in split.qrels.get(qid, {}):
            row = [j for j in row if split.doc_ids[j] != qid]
        out[qid] = row[:k]
    return out


def _ids(split: IRSplit, ranked: dict[str, list[int]]) -> dict[str, list[str]]:
    return {q: [split.doc_ids[j] for j in row] for q, row in ranked.items()}


class RunningTopK:
    """Each query's k lowest-energy documents of a corpus seen block by block, in the ranking rule's order
    (energy, then trec_eval's tie order): the lists of one pass over the whole corpus (L1 energies are the same
    numbers; a cosine matmul over a block may round the last bit otherwise; a corpus within DOC_BLOCK is one
    block, as before)."""

    def __init__(self, q: torch.Tensor, energy: str, k: int, tie: np.ndarray, fast_l1: bool | None = None):
        self.q, self.energy, self.k, self.tie = q, energy, k, tie  # tie: (N,) the corpus's trec tie order
        fast_l1 = len(tie) > DOC_BLOCK if fast_l1 is None else fast_l1  # None: above one block of documents
        self.fast_l1 = (fast_l1 and energy == "l1" and q.device.type == "cpu"  # fast_l1_block (on a GPU,
                        and _faiss() is not None)  # torch.cdist is the fast search)
        self.idx: torch.Tensor | None = None  # (Q, <= k) corpus indices
        self.val: torch.Tensor | None = None  # (Q, <= k) their energies

    def add(self, block: torch.Tensor, start: int) -> None:
        """Rank documents start .. start + len(block) (block: their outputs (B, dim))."""
        tie = self.tie[start:start + len(block)]
        if self.fast_l1 and len(block) > self.k + L1_MARGIN:
            idx, val = fast_l1_block(self.q, block, self.k, tie)
        else:
            idx, val = topk_ranking(lambda a, b: pairwise_energy(self.energy, self.q[a:b], block), k=self.k,
                                    n_queries=self.q.shape[0], tie_order=tie,
                                    chunk_size=max(1, min(RANK_CHUNK, RANK_BLOCK // max(1, len(block)))),
                                    return_energies=True)
        idx = idx + start
        if self.idx is None:
            self.idx, self.val = idx, val
            return
        idx, val = torch.cat([self.idx, idx], 1), torch.cat([self.val, val], 1)  # (Q, <= 2k)
        order = np.lexsort((self.tie[idx.numpy()], val.numpy()), axis=-1)[:, :self.k]  # energy, then ties
        self.idx = torch.gather(idx, 1, torch.as_tensor(order))
        self.val = torch.gather(val, 1, torch.as_tensor(order))


L1_MARGIN = 64  # FAISS candidates beyond k whose exact energies are computed (fast_l1_block)
L1_SAFE = 1e-4  # relative gap between FAISS's and torch's L1 sums that the exactness check allows for (seen: 1e-6)


def _faiss():
    try:
        import faiss  # here: an optional extra (headstore[faiss]); without it every block takes torch.cdist
    except ImportError:
        return None
    return faiss


def fast_l1_block(q: torch.Tensor, block: torch.Tensor, k: int, tie: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, k) indices into `block` and exact energies of each query's k lowest L1 energies, the ranking rule's
    order: FAISS's exact flat L1 search (SIMD; 3x torch.cdist here) proposes k + L1_MARGIN candidates, torch.cdist
    gives their energies (the numbers the one-pass ranking computes), and a query whose k-th energy is not
    clearly below every document left out (FAISS sums in another order) is ranked over the whole block instead."""
    faiss = _faiss()
    index = faiss.IndexFlat(block.shape[1], faiss.METRIC_L1)
    index.add(np.ascontiguousarray(block.numpy(), dtype=np.float32))
    bound, cand = index.search(np.ascontiguousarray(q.numpy(), dtype=np.float32), k + L1_MARGIN)  # (Q, k + m)
    cand = torch.as_tensor(cand)
    exact = torch.cat([candidate_energy("l1", q[s:s + RANK_CHUNK], block[cand[s:s + RANK_CHUNK]])
                       for s in range(0, len(q), RANK_CHUNK)])  # (Q, k + m)
    order = torch.as_tensor(np.lexsort((tie[cand.numpy()], exact.numpy()), axis=-1)[:, :k])
    idx, val = torch.gather(cand, 1, order), torch.gather(exact, 1, order)
    unsure = val[:, -1].numpy() >= bound[:, -1] * (1 - L1_SAFE)  # a left-out document could still tie or beat it
    for r in np.flatnonzero(unsure):
        i, v = topk_ranking(torch.cdist(q[r:r + 1], block, p=1.0), k=k, tie_order=tie, return_energies=True)
        idx[r], val[r] = i[0], v[0]
    return idx, val


def doc_blocks(d, n_docs: int):
    """(start, outputs (B, dim)) of every block of DOC_BLOCK documents: d is a (N, dim) tensor or a function
    (start, stop) -> outputs of those documents (embedded block by block)."""
    for start in range(0, n_docs, DOC_BLOCK):
        stop = min(n_docs, start + DOC_BLOCK)
        yield start, (d[start:stop] if isinstance(d, torch.Tensor) else d(start, stop))


def rank_split(split: IRSplit, q: torch.Tensor, d, energy: str, k: int = IR_TOPK, with_energies: bool = False):
    """One head's ranking of a split: q (Q, dim), d (N, dim) or a function (start, stop) -> (stop - start, dim)
    of document outputs -> {query id: [doc index]} (top k, the rule above), and with `with_energies` also
    {query id: [energy]} of those documents."""
    top = RunningTopK(q, energy, k + int(split.exclude_self), trec_tie_order(split.doc_ids))  # one spare: a
    for start, block in doc_blocks(d, len(split.doc_ids)):  # query's own text is dropped from its list
        top.add(block, start)
    return ranked_lists(split, top, k, with_energies)


def ranked_lists(split: IRSplit, top: RunningTopK, k: int = IR_TOPK, with_energies: bool = False):
    """{query id: [doc index]} of a finished RunningTopK (and {query id: [energy]} with `with_energies`)."""
    idx, val = top.idx, top.val
    if idx is None:  # no document
        idx, val = torch.zeros(len(split.query_ids), 0, dtype=torch.long), torch.zeros(len(split.query_ids), 0)
    ranked = ranked_ids(split, idx, k)
    if not with_energies:
        return ranked
    energies = {}
    for qid, row_idx, row_val in zip(split.query_ids, idx.tolist(), val.tolist()):
        by_doc = dict(zip(row_idx, row_val))
        energies[qid] = [by_doc[j] for j in ranked[qid]]
    return ranked, energies


def evaluate_ir(split: IRSplit, q: torch.Tensor, d, energy: str) -> tuple[dict, np.ndarray]:
    """One head's IR metrics on a split (nDCG, MRR, recall at 1/10/100, MAP@100) and its per-query nDCG@10."""
    return ir_metrics_of(split, rank_split(split, q, d, energy), energy)


def ir_metrics_of(split: IRSplit, ranked: dict[str, list[int]], energy: str) -> tuple[dict, np.ndarray]:
    """The IR metrics of a ranking (rank_split's lists) under `energy`'s prefix, and the per-query nDCG@10."""
    _, per_query = ir_metrics_per_query(_ids(split, ranked), split.qrels, (1, 10, 100))
    p = PREFIX[energy]
    return {f"{p}_{m}": float(v.mean()) for m, v in per_query.items()}, per_query["ndcg@10"]


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


def selection_ndcg(split: IRSplit, zq: torch.Tensor, zd: torch.Tensor, energy: str, precision: str) -> list[float]:
    """nDCG@10 of every head, one pass for all (energies of a block of heads in one batched call, L1 on
    candidates), with the ranking rule above. zq (H, Q, d), zd (H, N, d); a head whose outputs are not
    finite scores NaN."""
    H, Q, N = zq.shape[0], zq.shape[1], zd.shape[1]
    k = 10 + int(split.exclude_self)  # nDCG@10, one spare for a query's own text
    tie = trec_tie_order(split.doc_ids)
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
            _, per_query = ir_metrics_per_query(_ids(split, ranked_ids(split, ranked, 10)), split.qrels, (10,))
            scores.append(float(per_query["ndcg@10"].mean()))
    return scores


def trec_lines(split: IRSplit, q: torch.Tensor, d, energy: str, run_name: str,
               k: int = IR_TOPK) -> list[str]:
    """Run lines for one split: q (Q, dim) and d (N, dim) one head's outputs of its queries and corpus (d: or a
    function (start, stop) -> outputs of those documents, rank_split)."""
    return run_lines(split, *rank_split(split, q, d, energy, k, with_energies=True), run_name)


def run_lines(split: IRSplit, ranked: dict[str, list[int]], energies: dict[str, list[float]], run_name: str) -> list[str]:
    """Run lines of a ranking (rank_split's or ranked_lists' lists and energies)."""
    lines = []
    for qid in split.query_ids:
        for rank, (j, e) in enumerate(zip(ranked[qid], energies[qid]), start=1):
            lines.append(f"{qid} Q0 {split.doc_ids[j]} {rank} {-e:.9g} {run_name}")
    return lines


def write_trec_run(path: Path, lines: list[str]) -> Path:
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def candidate_split(split: IRSplit, X: torch.Tensor, pool_k: int) -> tuple[IRSplit, np.ndarray]:
    """The split with its corpus cut to the candidates: every query's frozen top `pool_k` (cosine over X's
    rows, heads.network.candidates) and every judged document; (that split, the kept document indices, ascending)."""
    pool = frozen_topk(X, split.query_rows, split.doc_rows, pool_k)
    judged = {d for q in split.query_ids for d in split.qrels.get(q, {})}
    relevant = np.array([j for j, d in enumerate(split.doc_ids) if d in judged], dtype=np.int64)
    keep = candidate_docs(pool, relevant)
    return IRSplit(split.query_ids, split.query_rows, [split.doc_ids[j] for j in keep], split.doc_rows[keep],
                   split.qrels, split.exclude_self, split.texts), keep
