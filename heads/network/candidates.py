"""Candidates at corpus scale: each query's frozen top-k documents, searched once.

Above `exact_max` corpus documents (TrainConfig, Negatives section), mining and per-epoch dev ranking stop
scanning the whole corpus every epoch. Instead every training query (a mining pool of `pool_k` documents) and
every dev query (dev candidates) is searched once in the frozen space (cosine on the features: an exact top-k
by blocked matmul, DOC_BLOCK documents at a time, so neither an index nor a normalised copy of the corpus is
held); each epoch re-scores only those candidates in each head's own space (heads.evaluation.mining, heads.kinds.ir).
An exact search costs fewer operations than training an IVF index over the same corpus (k-means over 4 sqrt(N)
lists) and has no recall to report.

`pool_k >= corpus size` gives every document to every query: candidate mining and selection then equal
the exact search (tests check it). The exact path is kept below `exact_max`, so small corpora (SciFact)
keep their numbers.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from headstore.heads.scoring.energy import candidate_energy

DOC_BLOCK = 1 << 15  # corpus rows scored at a time, here and in exact ranking (heads.kinds.ranking): 50 MB of
# float32 rows at d = 384, whatever the corpus size
QUERY_CHUNK = 256  # queries per matmul against a block: (256, 32768) similarities, 32 MB
POOL_CHUNK = 128  # anchors per block when re-scoring pools (fewer with many heads: POOL_FLOATS)
POOL_FLOATS = 1 << 25  # numbers of one block's pool outputs and energies, H x anchors x c x d: 128 MB of float32


def _unit(x: torch.Tensor) -> torch.Tensor:
    """Rows of a fresh copy (a gather) scaled to unit L2 norm in place: no second block in memory."""
    x = x.float()
    return x.div_(x.norm(dim=-1, keepdim=True).clamp_min_(1e-12))


def frozen_topk(X: torch.Tensor, queries: np.ndarray, corpus: np.ndarray, k: int) -> np.ndarray:
    """(Q, min(k, M)) int64 indices into `corpus` of each query's k nearest documents by cosine over the rows
    of X (queries, corpus: positions in X), each row sorted ascending (the corpus order, so ties among the
    re-scored candidates fall as in the exact search). k >= M returns every document for every query."""
    M = len(corpus)
    if k >= M:
        return np.tile(np.arange(M, dtype=np.int64), (len(queries), 1))
    q = _unit(X[torch.as_tensor(queries)])  # (Q, D)
    best_sim = torch.full((len(queries), 0), -float("inf"), device=q.device)
    best_idx = torch.zeros((len(queries), 0), dtype=torch.long, device=q.device)
    for s in range(0, M, DOC_BLOCK):
        d = _unit(X[torch.as_tensor(corpus[s:s + DOC_BLOCK])])  # (B, D)
        sims, idx = [], []
        for c in range(0, len(q), QUERY_CHUNK):
            top = torch.topk(q[c:c + QUERY_CHUNK] @ d.T, min(k, len(d)), dim=1)  # (c, <= k)
            sims.append(top.values)
            idx.append(top.indices + s)
        sim, ix = torch.cat([best_sim, torch.cat(sims)], 1), torch.cat([best_idx, torch.cat(idx)], 1)
        keep = torch.topk(sim, min(k, sim.shape[1]), dim=1).indices
        best_sim, best_idx = torch.gather(sim, 1, keep), torch.gather(ix, 1, keep)
    return np.sort(best_idx.cpu().numpy(), axis=1)


def pooled_negatives(za: torch.Tensor, zd_of: Callable[[np.ndarray], torch.Tensor], pool: np.ndarray, k: int,
                     exclude: list[list[int]], energy: str) -> torch.Tensor:
    """(H, U, k) corpus indices: each anchor's k lowest-energy documents among its pool (U, c), skipping the
    corpus indices in `exclude[u]`, every head in its own space (H = 1: the frozen space). za (H, U, d) the
    anchors' outputs; zd_of(corpus indices) -> (H, n, d) documents' outputs, asked for once per pooled document
    however many pools hold it (pools overlap: 2,000 anchors' top-101 at 1M documents are 143k documents in 202k
    entries; in head space each costs a forward pass). Only each anchor's own c documents are scored
    (candidate_energy), a bounded run at a time whatever H (64 heads over 1M documents held H x every pooled
    document: 20 GB)."""
    E = _pool_energies(za, zd_of, pool, energy)  # (H, U, c)
    drop = torch.as_tensor(np.array([np.isin(row, ex) for row, ex in zip(pool, exclude)]).reshape(pool.shape),
                           device=E.device)  # (U, c) the anchors' positives
    idx = torch.topk(E.masked_fill_(drop, float("inf")), k, dim=-1, largest=False, sorted=True).indices.cpu()  # (H, U, k)
    return torch.as_tensor(pool)[torch.arange(len(pool))[:, None], idx]  # (H, U, k) corpus indices


def _pool_energies(za: torch.Tensor, zd_of, pool: np.ndarray, energy: str) -> torch.Tensor:
    """(H, U, c) energies of every pool entry, every pooled document's outputs asked for once: runs of documents
    (about POOL_FLOATS outputs, at most POOL_CHUNK pools' worth), each scored against the anchors whose pools
    hold it. l1: cdist's numbers per pair, as the exact search's; l2 and cosine within float rounding (the 1M
    frozen space's cosine energies came out bit for bit those of scoring one block of anchors' pools at a time)."""
    H, (U, c), dim = za.shape[0], pool.shape, za.shape[2]
    docs, doc_of = np.unique(pool.reshape(-1), return_inverse=True)  # (n,) pooled documents, (U * c,) entry -> doc
    entries = np.argsort(doc_of, kind="stable")  # flat entries u * c + j, grouped by document
    bounds = np.searchsorted(doc_of[entries], np.arange(len(docs) + 1))  # document i's entries: bounds[i]:bounds[i+1]
    per_run = max(1, min(POOL_CHUNK * c, POOL_FLOATS // max(1, H * dim)))  # documents (and entries) per run
    E = za.new_empty((H, U * c))
    for s in range(0, len(docs), per_run):
        zd = zd_of(docs[s:s + per_run])  # (H, n, d)
        run = entries[bounds[s]:bounds[min(s + per_run, len(docs))]]
        for t in range(0, len(run), per_run):
            part = torch.as_tensor(run[t:t + per_run])  # (m,) flat entries
            q = za[:, torch.div(part, c, rounding_mode="floor")]  # (H, m, d) their anchors
            d = zd[:, torch.as_tensor(doc_of[part.numpy()] - s)]  # (H, m, d) their documents
            E[:, part.to(E.device)] = candidate_energy(energy, q, d.unsqueeze(-2)).squeeze(-1)  # (H, m)
    return E.view(H, U, c)


def top10_share(exact: torch.Tensor, candidates: np.ndarray) -> float:
    """The share of the exact top-10 documents (Q, 10) that are inside the candidate documents."""
    inside = torch.isin(exact, torch.as_tensor(candidates))
    return float(inside.float().mean()) if exact.numel() else float("nan")


def candidate_docs(pool: np.ndarray, relevant: Optional[np.ndarray] = None) -> np.ndarray:
    """The sorted union of every query's candidates (Q, c) and the relevant documents (corpus indices)."""
    parts = [pool.reshape(-1)] + ([relevant] if relevant is not None else [])
    return np.unique(np.concatenate(parts).astype(np.int64))
