"""Candidates at corpus scale: each query's frozen top-k documents from an approximate index, built once.

Above `exact_max` corpus documents (TrainConfig, Negatives section), mining and per-epoch dev ranking stop
scanning the whole corpus every epoch. Instead one FAISS IVF-Flat index (inner product on L2-normalised
features = cosine, the frozen space's similarity) is built once over the corpus, searched once for every
training query (a mining pool of `pool_k` documents) and every dev query (dev candidates), and then freed;
each epoch re-scores only those candidates in each head's own space (heads.mining, heads.kinds.ir).

`pool_k >= corpus size` gives every document to every query: candidate mining and selection then equal
the exact search (tests check it). The exact path is kept below `exact_max`, so small corpora (SciFact)
keep their numbers.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
import torch

from headstore.heads.energy import pairwise_energy
from headstore.heads.metrics import topk_ranking

NPROBE = 128  # IVF lists searched per query (of 4 sqrt(N): 3% of the corpus at 1M). On the synthetic 10k set
# of bench/scale_heads.py the pool of 100 held 99.0% of the exact cosine top-8 with 128, 79.0% with 32
TRAIN_PER_LIST = 40  # k-means training rows per IVF list (FAISS warns below 39)
ADD_CHUNK = 65536  # corpus rows normalised and added at a time (bounds the extra memory)
SEARCH_CHUNK = 1024  # queries per search call
POOL_CHUNK = 128  # anchors per block when re-scoring pools


def _unit(x: torch.Tensor) -> np.ndarray:
    x = x.float()
    return np.ascontiguousarray(torch.nn.functional.normalize(x, dim=-1).numpy(), dtype=np.float32)


def frozen_topk(X: torch.Tensor, queries: np.ndarray, corpus: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """(Q, min(k, M)) int64 indices into `corpus` of each query's nearest documents by cosine over the rows
    of X (queries, corpus: positions in X), each row sorted ascending (the corpus order, so ties among the
    re-scored candidates fall as in the exact search). k >= M returns every document for every query."""
    M = len(corpus)
    if k >= M:
        return np.tile(np.arange(M, dtype=np.int64), (len(queries), 1))
    try:
        import faiss
    except ImportError:
        raise ValueError(f"a corpus of {M} documents is above exact_max: candidates need FAISS (pip install "
                         "'headstore[faiss]'), or raise --exact-max to search exactly") from None
    dim = X.shape[1]
    nlist = max(1, min(int(4 * math.sqrt(M)), M // TRAIN_PER_LIST))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(M, size=min(M, nlist * TRAIN_PER_LIST), replace=False))
    index.train(_unit(X[torch.as_tensor(corpus[sample])]))
    for s in range(0, M, ADD_CHUNK):
        index.add(_unit(X[torch.as_tensor(corpus[s:s + ADD_CHUNK])]))
    index.nprobe = min(NPROBE, nlist)
    out = np.empty((len(queries), k), dtype=np.int64)
    for s in range(0, len(queries), SEARCH_CHUNK):
        _, idx = index.search(_unit(X[torch.as_tensor(queries[s:s + SEARCH_CHUNK])]), k)
        out[s:s + SEARCH_CHUNK] = idx
    del index, quantizer
    missing = out < 0  # a query whose probed lists hold fewer than k documents: pad with other documents
    if missing.any():
        for r in np.flatnonzero(missing.any(1)):
            have = out[r][out[r] >= 0]
            fill = np.setdiff1d(np.arange(M), have)[: k - len(have)]
            out[r] = np.concatenate([have, fill])
    return np.sort(out, axis=1)


def pool_topk(energy_of: Callable[[np.ndarray, np.ndarray], torch.Tensor], pool: np.ndarray, k: int,
              exclude: list[list[int]]) -> torch.Tensor:
    """(U, k) corpus indices: each anchor's k lowest-energy documents among its pool (U, c), skipping the
    corpus indices in `exclude[u]`. energy_of(anchor block, docs) -> (block, len(docs)) energies of the
    block's anchors against the union of their pools."""
    out = []
    for s in range(0, len(pool), POOL_CHUNK):
        block = pool[s:s + POOL_CHUNK]
        docs, where = np.unique(block, return_inverse=True)
        E = energy_of(np.arange(s, s + len(block)), docs)  # (b, |docs|)
        E = torch.gather(E, 1, torch.as_tensor(where.reshape(block.shape)))  # (b, c): each anchor's pool
        drop = [[j for j, d in enumerate(row) if d in ex] if ex else []
                for row, ex in zip(block.tolist(), (set(e) for e in exclude[s:s + len(block)]))]
        idx = topk_ranking(E, k=k, exclude=drop, chunk_size=len(block))
        out.append(torch.as_tensor(block)[torch.arange(len(block))[:, None], idx])
    return torch.cat(out)


def pooled_negatives(za: torch.Tensor, zd_of: Callable[[np.ndarray], torch.Tensor], pool: np.ndarray, k: int,
                     exclude: list[list[int]], energy: str) -> torch.Tensor:
    """(U, k) corpus indices of one space: anchors' outputs za (U, d); zd_of(corpus indices) -> (n, d)."""
    def energy_of(anchors: np.ndarray, docs: np.ndarray) -> torch.Tensor:
        return pairwise_energy(energy, za[torch.as_tensor(anchors)], zd_of(docs))

    return pool_topk(energy_of, pool, k, exclude)


def top10_share(exact: torch.Tensor, candidates: np.ndarray) -> float:
    """The share of the exact top-10 documents (Q, 10) that are inside the candidate documents."""
    inside = torch.isin(exact, torch.as_tensor(candidates))
    return float(inside.float().mean()) if exact.numel() else float("nan")


def candidate_docs(pool: np.ndarray, relevant: Optional[np.ndarray] = None) -> np.ndarray:
    """The sorted union of every query's candidates (Q, c) and the relevant documents (corpus indices)."""
    parts = [pool.reshape(-1)] + ([relevant] if relevant is not None else [])
    return np.unique(np.concatenate(parts).astype(np.int64))
